//! Measuring instruments: YCSB workload generators, a load driver (closed and open loop) with
//! HDR latency histograms, targets (Chorus and Redis over RESP, etcd over gRPC),
//! peer systems started side by side on the same emulated network, TPC-C over the PostgreSQL
//! wire protocol, the servers' CPU per operation, JSON reports and PNG plots.

pub mod cli;
pub mod compare;
pub mod cpu;
pub mod curp_target;
pub mod driver;
pub mod etcd_target;
pub mod generator;
pub mod grpc;
pub mod ldc_bench;
pub mod ldc_costs;
pub mod peers;
pub mod plot;
pub mod reduction_bench;
pub mod report;
pub mod resp_target;
pub mod rng;
pub mod streams;
pub mod target;
pub mod tpcc;
pub mod unicache_bench;
pub mod workload;
