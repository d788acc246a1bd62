//! What the simulated clients know of the queues they declared and deleted: every incarnation of
//! a queue name (a declare makes one, its queue.delete ends it), and which of those calls were
//! answered. After every restart, the definitions the node recovered are checked against it.

use crate::ledger::{violation, Violation};
use std::collections::BTreeSet;

/// Where a queue incarnation stands, as its clients saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// queue.declare sent, declare-ok not received (the power went in between).
    Declaring,
    /// declare-ok received.
    Declared,
    /// queue.delete sent, delete-ok not received.
    Deleting,
    /// delete-ok received, or recovery showed an unanswered call left it gone.
    Deleted,
}

/// One life of a queue name.
#[derive(Debug, Clone)]
pub struct Incarnation {
    /// The queue's name (also its log directory's name).
    pub name: String,
    /// Where it stands.
    pub lifecycle: Lifecycle,
    /// Whether its binding from the simulator's exchange was answered (bind-ok).
    pub bound: bool,
}

/// Every queue incarnation of the run, indexed as the ledger indexes queues.
#[derive(Debug, Default)]
pub struct Catalog {
    incarnations: Vec<Incarnation>,
}

/// What a restart makes of the recovered definitions.
#[derive(Debug, Default)]
pub struct Resolved {
    /// The incarnations whose queues the node opens, by index.
    pub open: Vec<usize>,
    /// The incarnations an unanswered delete left gone: their messages are gone too.
    pub gone: Vec<usize>,
    /// The incarnations an unanswered declare left gone: none of their messages may have been
    /// confirmed (a confirm waits for the queue's definition).
    pub never_declared: Vec<usize>,
}

impl Catalog {
    /// A declare of `name` starts: a new incarnation, returned by index.
    pub fn declare_started(&mut self, name: &str) -> usize {
        self.incarnations.push(Incarnation { name: name.to_string(), lifecycle: Lifecycle::Declaring, bound: false });
        self.incarnations.len() - 1
    }

    /// The incarnation at `index`.
    pub fn get(&self, index: usize) -> &Incarnation {
        &self.incarnations[index]
    }

    /// Moves `index` to `lifecycle` (an answer arrived, or a delete started).
    pub fn set(&mut self, index: usize, lifecycle: Lifecycle) {
        self.incarnations[index].lifecycle = lifecycle;
    }

    /// Records bind-ok for `index`.
    pub fn bound(&mut self, index: usize) {
        self.incarnations[index].bound = true;
    }

    /// The latest incarnation of `name`.
    pub fn latest(&self, name: &str) -> Option<usize> {
        self.incarnations.iter().rposition(|incarnation| incarnation.name == name)
    }

    /// Whether `name` may be declared now (it has no live incarnation).
    pub fn is_free(&self, name: &str) -> bool {
        self.latest(name).is_none_or(|index| self.incarnations[index].lifecycle == Lifecycle::Deleted)
    }

    /// After a restart: `queues` are the names the recovered definitions hold, `bindings` the
    /// queues bound from the simulator's exchange. A declare that was answered is there; a delete
    /// that was answered is not back; an unanswered one is resolved to whichever side recovery
    /// shows (its queue fully there or fully gone: the ledger then checks its messages); a
    /// binding that was answered is there while its queue is, and none names a queue that is not.
    pub fn recovered(&mut self, queues: &BTreeSet<String>, bindings: &BTreeSet<String>) -> Result<Resolved, Violation> {
        let mut resolved = Resolved::default();
        for name in queues {
            if self.latest(name).is_none() {
                violation!("the definitions hold queue {name}, never declared");
            }
        }
        for name in bindings {
            if !queues.contains(name) {
                violation!("the definitions hold a binding to queue {name}, which they do not hold");
            }
        }
        for index in 0..self.incarnations.len() {
            // An older incarnation of a name is never what the definitions hold.
            let present = self.latest_index_of(index) == index && queues.contains(&self.incarnations[index].name);
            let incarnation = &mut self.incarnations[index];
            match (incarnation.lifecycle, present) {
                (Lifecycle::Declared, false) => violation!("queue {} (declare-ok received) lost after a restart", incarnation.name),
                (Lifecycle::Deleted, true) => violation!("queue {} came back after its delete-ok", incarnation.name),
                (Lifecycle::Deleted, false) => {}
                (Lifecycle::Declaring, false) => {
                    incarnation.lifecycle = Lifecycle::Deleted;
                    resolved.never_declared.push(index);
                }
                (Lifecycle::Deleting, false) => {
                    incarnation.lifecycle = Lifecycle::Deleted;
                    resolved.gone.push(index);
                }
                (lifecycle, true) => {
                    let binding = bindings.contains(&incarnation.name);
                    if lifecycle != Lifecycle::Declaring && incarnation.bound && !binding {
                        violation!("queue {}: its binding (bind-ok received) lost after a restart", incarnation.name);
                    }
                    incarnation.lifecycle = Lifecycle::Declared;
                    incarnation.bound = binding;
                    resolved.open.push(index);
                }
            }
        }
        Ok(resolved)
    }

    fn latest_index_of(&self, index: usize) -> usize {
        self.latest(&self.incarnations[index].name).unwrap_or(index)
    }
}
