//! Proof under faults: a history-recording workload against a real local cluster, a fault
//! schedule (crashes, pauses, partitions, full restarts, power cuts) seeded for replay, and a
//! linearizability checker; or the locks and queues applications build, or a bank on a SQL
//! cluster, and their checks.

pub mod bank;
pub mod checker;
pub mod curp_tally;
pub mod disks;
pub mod faults;
pub mod history;
pub mod idioms;
pub mod run;
pub mod workload;
