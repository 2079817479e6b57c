//! Completion queues and their notifications.
//!
//! A CQ is a bounded ring of [`WorkCompletion`]s that the context fills as
//! the core completes work, and the application drains with `poll_cq`. A
//! waiter that would rather block than poll arms the CQ with
//! `req_notify_cq` (ibverbs `ibv_req_notify_cq`): the next completion that
//! lands in it then puts one event on the device's completion channel (a
//! CQ armed with `solicited_only` waits for a solicited receive completion
//! or any error completion instead). The arm is one-shot, as in ibverbs:
//! take the event, arm again, then poll the CQ empty, so that nothing that
//! landed in between is missed.
//!
//! The channel is polled (`poll_cq_event`), as everything is in a sans-IO
//! context: the driver that owns the context checks it after every input
//! and wakes a blocked waiter (the UDP device's `get_cq_event`).

use crate::VerbsError;
use crate::WorkCompletion;
use metaroce_proto::WcStatus;
use std::collections::VecDeque;

/// Largest CQ, in completions.
pub const MAX_CQE: usize = 1 << 22;
/// Most CQs a context holds at once.
pub const MAX_CQ: u32 = 1 << 20;

/// A completion queue: a slot of the context's CQ table and the slot's
/// generation, so a destroyed CQ's handle never reaches a later one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CompletionQueue {
    index: u32,
    generation: u32,
}

/// What an armed CQ waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    /// Any completion.
    Next,
    /// A solicited receive completion, or a completion in error.
    Solicited,
}

#[derive(Debug)]
struct Cq {
    ring: VecDeque<WorkCompletion>,
    capacity: usize,
    overrun: bool,
    armed: Option<Arm>,
}

/// Every CQ of a context, and the context's completion channel.
#[derive(Debug, Default)]
pub(crate) struct CqTable {
    slots: Vec<(u32, Option<Cq>)>,
    free: Vec<u32>,
    live: u32,
    /// The completion channel: one entry per fired arm, oldest first.
    events: VecDeque<CompletionQueue>,
}

impl CqTable {
    /// A CQ with room for `cqe` completions.
    pub(crate) fn create(&mut self, cqe: usize) -> Result<CompletionQueue, VerbsError> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(VerbsError::BadAttribute {
                attr: "cqe",
                reason: "must be 1..=2^22",
            });
        }
        if self.live >= MAX_CQ {
            return Err(VerbsError::BadAttribute {
                attr: "cqe",
                reason: "too many completion queues (2^20)",
            });
        }
        let cq = Cq {
            ring: VecDeque::with_capacity(cqe.min(4096)),
            capacity: cqe,
            overrun: false,
            armed: None,
        };
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                self.slots.len() as u32 - 1
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.1 = Some(cq);
        self.live += 1;
        Ok(CompletionQueue {
            index,
            generation: slot.0,
        })
    }

    /// Whether `cq` names a live CQ.
    pub(crate) fn exists(&self, cq: CompletionQueue) -> bool {
        self.get(cq).is_some()
    }

    fn get(&self, cq: CompletionQueue) -> Option<&Cq> {
        match self.slots.get(cq.index as usize) {
            Some((generation, Some(q))) if *generation == cq.generation => Some(q),
            _ => None,
        }
    }

    fn get_mut(&mut self, cq: CompletionQueue) -> Option<&mut Cq> {
        match self.slots.get_mut(cq.index as usize) {
            Some((generation, Some(q))) if *generation == cq.generation => Some(q),
            _ => None,
        }
    }

    /// Free `cq` (the caller checked no QP uses it); its completions and
    /// pending events go with it.
    pub(crate) fn destroy(&mut self, cq: CompletionQueue) -> Result<(), VerbsError> {
        self.get(cq)
            .ok_or(VerbsError::Unknown("completion queue"))?;
        let slot = &mut self.slots[cq.index as usize];
        slot.1 = None;
        slot.0 = slot.0.wrapping_add(1);
        self.free.push(cq.index);
        self.live -= 1;
        self.events.retain(|&e| e != cq);
        Ok(())
    }

    /// A completion lands in `cq`; it fires the CQ's arm if it matches.
    pub(crate) fn push(&mut self, cq: CompletionQueue, wc: WorkCompletion, solicited: bool) {
        let Some(q) = self.get_mut(cq) else {
            return;
        };
        if q.ring.len() >= q.capacity {
            // Lost: the CQ is unusable from now on (ibverbs raises
            // IBV_EVENT_CQ_ERR).
            q.overrun = true;
            return;
        }
        q.ring.push_back(wc);
        let fires = match q.armed {
            None => false,
            Some(Arm::Next) => true,
            Some(Arm::Solicited) => solicited || wc.status != WcStatus::Success,
        };
        if fires {
            q.armed = None;
            self.events.push_back(cq);
        }
    }

    /// Move up to `out.len()` completions of `cq` into `out`, oldest first.
    pub(crate) fn poll(
        &mut self,
        cq: CompletionQueue,
        out: &mut [WorkCompletion],
    ) -> Result<usize, VerbsError> {
        let q = self
            .get_mut(cq)
            .ok_or(VerbsError::Unknown("completion queue"))?;
        if q.overrun {
            return Err(VerbsError::CqOverrun);
        }
        let n = out.len().min(q.ring.len());
        if n == 0 {
            // The common answer of a busy-polling loop: no drain to set up
            // and tear down for nothing.
            return Ok(0);
        }
        for (slot, c) in out.iter_mut().zip(q.ring.drain(..n)) {
            *slot = c;
        }
        Ok(n)
    }

    /// Whether a poll of `cq` would return something: a completion, an
    /// overrun, or (unknown CQ) an error.
    pub(crate) fn has_completions(&self, cq: CompletionQueue) -> bool {
        self.get(cq).is_none_or(|q| q.overrun || !q.ring.is_empty())
    }

    /// Arm `cq` for its next completion (or, with `solicited_only`, its
    /// next solicited or failed one). Completions already in the CQ do not
    /// fire it.
    pub(crate) fn arm(
        &mut self,
        cq: CompletionQueue,
        solicited_only: bool,
    ) -> Result<(), VerbsError> {
        let q = self
            .get_mut(cq)
            .ok_or(VerbsError::Unknown("completion queue"))?;
        // A pending request for any completion is not narrowed by a later
        // solicited-only one (the ibverbs rule).
        q.armed = match (q.armed, solicited_only) {
            (Some(Arm::Next), _) | (_, false) => Some(Arm::Next),
            _ => Some(Arm::Solicited),
        };
        Ok(())
    }

    /// The next event of the completion channel.
    pub(crate) fn next_event(&mut self) -> Option<CompletionQueue> {
        self.events.pop_front()
    }

    /// Whether the completion channel has an event.
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }
}
