//! The `AgentDeployment` API: custom resource types, the names every Baton
//! component agrees on, and validation. No Kubernetes client, no runtime.
#![forbid(unsafe_code)]

pub mod agent_contract;
mod agent_deployment;
pub mod constants;
pub mod names;
pub mod parse;
pub mod validate;

pub use agent_deployment::*;
pub use validate::{ValidAgentDeployment, ValidationErrors, Violation, validate};
