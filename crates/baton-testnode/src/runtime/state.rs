//! What the node knows about one pod's sandbox and containers, shared by
//! the container supervisors (writers), the status writer and
//! [`crate::TestNode`]'s accessors (readers).

use std::net::Ipv4Addr;
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::Notify;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Current {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated(Termination),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Termination {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub message: Option<String>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
    pub container_id: Option<String>,
}

#[derive(Clone, Debug)]
pub(crate) struct ContainerState {
    pub name: String,
    pub image: String,
    pub image_id: String,
    pub current: Current,
    pub last: Option<Termination>,
    pub restart_count: i32,
    pub ready: bool,
    pub started: bool,
    pub pid: Option<u32>,
    pub container_id: Option<String>,
    /// Terminated for good: the restart policy does not restart it.
    pub done: bool,
}

impl ContainerState {
    pub fn new(name: &str, image: &str) -> Self {
        Self {
            name: name.to_owned(),
            image: image.to_owned(),
            image_id: String::new(),
            current: Current::Waiting {
                reason: "ContainerCreating".into(),
                message: None,
            },
            last: None,
            restart_count: 0,
            ready: false,
            started: false,
            pid: None,
            container_id: None,
            done: false,
        }
    }
}

/// Which container of the pod: an init container or a regular one, by
/// its index in the spec's list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub init: bool,
    pub index: usize,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct PodState {
    pub ip: Option<Ipv4Addr>,
    pub netns: Option<String>,
    pub start_time: Option<Timestamp>,
    pub init_containers: Vec<ContainerState>,
    pub containers: Vec<ContainerState>,
    /// The sandbox is up (PodReadyToStartContainers).
    pub sandbox_ready: bool,
}

pub(crate) struct PodShared {
    state: Mutex<PodState>,
    /// Poked on every change; the status writer coalesces.
    pub changed: Notify,
}

impl PodShared {
    pub fn new(state: PodState) -> Self {
        Self {
            state: Mutex::new(state),
            changed: Notify::new(),
        }
    }

    pub fn read<R>(&self, f: impl FnOnce(&PodState) -> R) -> R {
        f(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn update<R>(&self, f: impl FnOnce(&mut PodState) -> R) -> R {
        let out = f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.notify_one();
        out
    }

    pub fn update_container<R>(&self, slot: Slot, f: impl FnOnce(&mut ContainerState) -> R) -> R {
        self.update(|s| {
            let list = if slot.init {
                &mut s.init_containers
            } else {
                &mut s.containers
            };
            f(&mut list[slot.index])
        })
    }

    pub fn container(&self, slot: Slot) -> ContainerState {
        self.read(|s| {
            let list = if slot.init {
                &s.init_containers
            } else {
                &s.containers
            };
            list[slot.index].clone()
        })
    }

    pub fn snapshot(&self) -> PodState {
        self.read(Clone::clone)
    }
}
