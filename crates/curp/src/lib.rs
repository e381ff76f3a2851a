//! CURP's pieces that do not depend on how state is stored: RIFL's completion records (exactly-once
//! writes), the witnesses (fast-path durability, recovery's quorum rule) and a node's durable
//! witness, served to peers.

pub mod durable_witness;
pub mod rifl;
pub mod witness;
