//! CURP's pieces that do not depend on how state is stored: RIFL's completion records (exactly-once
//! writes) and the witnesses (fast-path durability, recovery's quorum rule).

pub mod rifl;
pub mod witness;
