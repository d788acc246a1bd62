//! The durable definitions as keyed maps, and the changes the broker makes to them.
//!
//! The definitions store replays its change log onto the last snapshot with [`DefinitionState::apply`]
//! at start, and applies each new change with the same function when it is submitted, so the
//! state in memory (what the next snapshot writes) and the state a restart rebuilds are one
//! function of the same records. Each change costs O(log n) plus what it removes: deleting a
//! queue or an exchange also deletes the bindings to (and from) it, found through an index by
//! destination, as the topology deletes them; deleting a vhost deletes what was in it.

use crate::definitions::{
    BindingRecord, Definitions, ExchangeRecord, PermissionRecord, PolicyRecord, QueueRecord, TopicPermissionRecord, UserRecord, VhostRecord,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Users, permissions, vhosts and policies: few, changed rarely, and stored whole on each change
/// (their size does not grow with the number of queues).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlPlaneRecord {
    /// Users; `None` means the embedded default (`guest`).
    pub users: Option<Vec<UserRecord>>,
    /// Permissions; `None` means the default (guest has all of `/`).
    pub permissions: Option<Vec<PermissionRecord>>,
    /// Topic permissions (absent from files written before they existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topic_permissions: Vec<TopicPermissionRecord>,
    /// Vhosts; `None` means the default vhost `/` alone.
    pub vhosts: Option<Vec<VhostRecord>>,
    /// Policies.
    pub policies: Vec<PolicyRecord>,
    /// Operator policies (absent from files written before they existed).
    #[serde(default)]
    pub operator_policies: Vec<PolicyRecord>,
}

/// One change to the durable definitions, as one record of the change log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum DefinitionChange {
    /// A durable exchange was declared.
    PutExchange(ExchangeRecord),
    /// An exchange was deleted, with every binding from or to it.
    DeleteExchange {
        /// Vhost name.
        vhost: String,
        /// Exchange name.
        name: String,
    },
    /// A durable queue was declared.
    PutQueue(QueueRecord),
    /// A queue was deleted, with every binding to it.
    DeleteQueue {
        /// Vhost name.
        vhost: String,
        /// Queue name.
        name: String,
    },
    /// A binding between durable ends was added.
    PutBinding(BindingRecord),
    /// A binding was removed.
    DeleteBinding(BindingRecord),
    /// A vhost was deleted: its exchanges, queues, bindings, permissions and policies go with it.
    DeleteVhost {
        /// Vhost name.
        name: String,
    },
    /// The users, permissions, vhosts and policies, whole.
    ControlPlane(ControlPlaneRecord),
}

/// (vhost, name).
type NameKey = (String, String);

/// (vhost, source, destination is an exchange, destination, routing key, arguments).
type BindingKey = (String, String, bool, String, String, String);

/// (vhost, destination is an exchange, destination, source, routing key, arguments): the index
/// that finds the bindings to a queue or exchange being deleted.
type DestinationKey = (String, bool, String, String, String, String);

/// Every durable definition, keyed for changes of O(log n).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DefinitionState {
    exchanges: BTreeMap<NameKey, ExchangeRecord>,
    queues: BTreeMap<NameKey, QueueRecord>,
    bindings: BTreeMap<BindingKey, BindingRecord>,
    bindings_by_destination: BTreeSet<DestinationKey>,
    control_plane: ControlPlaneRecord,
}

fn binding_key(record: &BindingRecord) -> BindingKey {
    (
        record.vhost.clone(),
        record.source.clone(),
        record.destination_is_exchange,
        record.destination.clone(),
        record.routing_key.clone(),
        record.arguments_hex.clone(),
    )
}

fn destination_key(key: &BindingKey) -> DestinationKey {
    let (vhost, source, is_exchange, destination, routing_key, arguments) = key.clone();
    (vhost, is_exchange, destination, source, routing_key, arguments)
}

impl DefinitionState {
    /// The state a snapshot holds.
    pub fn from_definitions(definitions: &Definitions) -> DefinitionState {
        let mut state = DefinitionState {
            control_plane: ControlPlaneRecord {
                users: definitions.users.clone(),
                permissions: definitions.permissions.clone(),
                topic_permissions: definitions.topic_permissions.clone(),
                vhosts: definitions.vhosts.clone(),
                policies: definitions.policies.clone(),
                operator_policies: definitions.operator_policies.clone(),
            },
            ..DefinitionState::default()
        };
        for exchange in &definitions.exchanges {
            state.apply(DefinitionChange::PutExchange(exchange.clone()));
        }
        for queue in &definitions.queues {
            state.apply(DefinitionChange::PutQueue(queue.clone()));
        }
        for binding in &definitions.bindings {
            state.apply(DefinitionChange::PutBinding(binding.clone()));
        }
        state
    }

    /// The state as a snapshot writes it (sorted by vhost and name), in `storage_format_version`.
    pub fn to_definitions(&self, storage_format_version: u32, log_generation: u64) -> Definitions {
        Definitions {
            storage_format_version,
            log_generation,
            exchanges: self.exchanges.values().cloned().collect(),
            queues: self.queues.values().cloned().collect(),
            bindings: self.bindings.values().cloned().collect(),
            users: self.control_plane.users.clone(),
            permissions: self.control_plane.permissions.clone(),
            topic_permissions: self.control_plane.topic_permissions.clone(),
            vhosts: self.control_plane.vhosts.clone(),
            policies: self.control_plane.policies.clone(),
            operator_policies: self.control_plane.operator_policies.clone(),
        }
    }

    /// How many exchanges, queues and bindings it holds.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.exchanges.len(), self.queues.len(), self.bindings.len())
    }

    /// Applies one change. Idempotent: applying a change twice leaves what applying it once does.
    pub fn apply(&mut self, change: DefinitionChange) {
        match change {
            DefinitionChange::PutExchange(record) => {
                self.exchanges.insert((record.vhost.clone(), record.name.clone()), record);
            }
            DefinitionChange::DeleteExchange { vhost, name } => {
                self.remove_bindings_from(&vhost, &name);
                self.remove_bindings_to(&vhost, true, &name);
                self.exchanges.remove(&(vhost, name));
            }
            DefinitionChange::PutQueue(record) => {
                self.queues.insert((record.vhost.clone(), record.name.clone()), record);
            }
            DefinitionChange::DeleteQueue { vhost, name } => {
                self.remove_bindings_to(&vhost, false, &name);
                self.queues.remove(&(vhost, name));
            }
            DefinitionChange::PutBinding(record) => {
                let key = binding_key(&record);
                self.bindings_by_destination.insert(destination_key(&key));
                self.bindings.insert(key, record);
            }
            DefinitionChange::DeleteBinding(record) => self.remove_binding(&binding_key(&record)),
            DefinitionChange::DeleteVhost { name } => self.remove_vhost(&name),
            DefinitionChange::ControlPlane(record) => self.control_plane = record,
        }
    }

    fn remove_binding(&mut self, key: &BindingKey) {
        self.bindings.remove(key);
        self.bindings_by_destination.remove(&destination_key(key));
    }

    fn remove_bindings_from(&mut self, vhost: &str, source: &str) {
        // Keys sort by vhost, then source: every binding of this source follows the lowest key.
        let low: BindingKey = (vhost.to_string(), source.to_string(), false, String::new(), String::new(), String::new());
        let keys: Vec<BindingKey> =
            self.bindings.range(low..).map(|(key, _)| key).take_while(|key| key.0 == vhost && key.1 == source).cloned().collect();
        for key in keys {
            self.remove_binding(&key);
        }
    }

    fn remove_bindings_to(&mut self, vhost: &str, is_exchange: bool, destination: &str) {
        let low: DestinationKey = (vhost.to_string(), is_exchange, destination.to_string(), String::new(), String::new(), String::new());
        let keys: Vec<DestinationKey> = self
            .bindings_by_destination
            .range(low..)
            .take_while(|key| key.0 == vhost && key.1 == is_exchange && key.2 == destination)
            .cloned()
            .collect();
        for (vhost, is_exchange, destination, source, routing_key, arguments) in keys {
            self.remove_binding(&(vhost, source, is_exchange, destination, routing_key, arguments));
        }
    }

    fn remove_vhost(&mut self, vhost: &str) {
        let low = (vhost.to_string(), String::new());
        let exchanges: Vec<NameKey> =
            self.exchanges.range(low.clone()..).map(|(key, _)| key).take_while(|key| key.0 == vhost).cloned().collect();
        for (vhost, name) in exchanges {
            self.apply(DefinitionChange::DeleteExchange { vhost, name });
        }
        let queues: Vec<NameKey> = self.queues.range(low..).map(|(key, _)| key).take_while(|key| key.0 == vhost).cloned().collect();
        for (vhost, name) in queues {
            self.apply(DefinitionChange::DeleteQueue { vhost, name });
        }
        // A binding whose ends were both durable went with them; this is for a file written by hand.
        let low: BindingKey = (vhost.to_string(), String::new(), false, String::new(), String::new(), String::new());
        let bindings: Vec<BindingKey> = self.bindings.range(low..).map(|(key, _)| key).take_while(|key| key.0 == vhost).cloned().collect();
        for key in bindings {
            self.remove_binding(&key);
        }
        let control_plane = &mut self.control_plane;
        if let Some(vhosts) = control_plane.vhosts.as_mut() {
            vhosts.retain(|record| record.name != vhost);
        }
        if let Some(permissions) = control_plane.permissions.as_mut() {
            permissions.retain(|record| record.vhost != vhost);
        }
        control_plane.topic_permissions.retain(|record| record.vhost != vhost);
        control_plane.policies.retain(|record| record.vhost != vhost);
        control_plane.operator_policies.retain(|record| record.vhost != vhost);
    }
}
