//! Stage 5: the only side effects on the network. Decisions go to any set of actuators
//! through one trait; failures are counted and logged, never fatal.
pub mod shim;
