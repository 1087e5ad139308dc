//! Running pods: sandbox and containers per pod, as local processes.

pub(crate) mod container;
pub(crate) mod launch;
pub(crate) mod pod;
pub(crate) mod process;
pub(crate) mod state;
