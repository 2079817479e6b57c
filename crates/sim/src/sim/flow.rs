//! Driving the workload: one channel per ordered host pair, each flow
//! posted as one message at its start time or when its trigger fires, and
//! completions counted and fed to the triggers that wait on them (how
//! dependent steps such as a ring all-reduce's chain).

use super::Sim;
use crate::error::SimError;
use crate::event::EventKind;
use crate::time::Ps;
use crate::transport::{MessageEvent, Transport, TransportFactory};
use std::collections::HashMap;
use std::collections::hash_map::Entry;

impl<F: TransportFactory> Sim<F> {
    /// Open the channels the flows need, count the flows awaited, and
    /// schedule or attach every flow's start.
    pub(super) fn setup_flows(&mut self, factory: &F) -> Result<(), SimError> {
        // One channel per ordered (src, dst) pair, shared by its flows.
        let mut chan: HashMap<(u32, u32), u32> = HashMap::new();
        let mut messages: HashMap<(u32, u32), u32> = HashMap::new();
        for f in &self.work.flows {
            *messages.entry((f.src, f.dst)).or_insert(0) += 1;
        }
        for i in 0..self.work.flows.len() {
            let f = &self.work.flows[i];
            let (src, dst) = (f.src, f.dst);
            if src >= self.topo.hosts || dst >= self.topo.hosts || src == dst {
                return Err(SimError::FlowHosts { flow: i, src, dst });
            }
            if let Entry::Vacant(e) = chan.entry((src, dst)) {
                let (a, b) = pair_mut(&mut self.hosts, src as usize, dst as usize);
                let c = factory.open_channel(
                    &mut a.transport,
                    src,
                    &mut b.transport,
                    dst,
                    messages[&(src, dst)],
                )?;
                e.insert(c);
                a.channels.push((dst, c));
            }
            if !f.background {
                self.waiting += 1;
            }
            match (f.start, f.trigger) {
                (_, Some(t)) => self
                    .trigger_flows
                    .get_mut(t as usize)
                    .ok_or(SimError::UnknownTrigger {
                        flow: i,
                        trigger: t,
                    })?
                    .push(i as u32),
                (Some(s), None) => self.events.schedule(s, EventKind::FlowStart(i as u32)),
                (None, None) => return Err(SimError::FlowNeverStarts { flow: i }),
            }
        }
        Ok(())
    }

    /// Flow `f` starts: its sender posts it as one message.
    pub(super) fn flow_start(&mut self, now: Ps, f: u32) {
        let spec = &self.work.flows[f as usize];
        let (src, dst, bytes) = (spec.src, spec.dst, spec.bytes);
        let host = &mut self.hosts[src as usize];
        let ch = host
            .channels
            .iter()
            .find(|&&(d, _)| d == dst)
            .map(|&(_, c)| c)
            .expect("channel opened at setup");
        self.measured.flows[f as usize].started = Some(now);
        if let Err(cause) = host.transport.post_message(now, ch, bytes, f) {
            self.error = Some(SimError::PostRefused {
                flow: f,
                src,
                dst,
                bytes,
                cause,
            });
            return;
        }
        self.host_service(now, src);
    }

    /// A transport reports on a message (a flow): record it, count the
    /// flow finished once both ends are done (or it failed), and start the
    /// flows a trigger releases.
    pub(super) fn message_event(&mut self, now: Ps, ev: MessageEvent) {
        let (tag, trig) = match ev {
            MessageEvent::Sent { tag } => {
                self.measured.flows[tag as usize].sent = Some(now);
                (tag, self.work.flows[tag as usize].on_send)
            }
            MessageEvent::Received { tag } => {
                self.measured.flows[tag as usize].received = Some(now);
                (tag, self.work.flows[tag as usize].on_recv)
            }
            MessageEvent::Failed { tag } => {
                self.measured.flows[tag as usize].failed = true;
                (tag, None)
            }
        };
        let run = self.measured.flows[tag as usize];
        let finished_now = match ev {
            MessageEvent::Failed { .. } => run.received.is_none() || run.sent.is_none(),
            MessageEvent::Sent { .. } => run.received.is_some() && !run.failed,
            MessageEvent::Received { .. } => run.sent.is_some() && !run.failed,
        };
        if finished_now && !self.work.flows[tag as usize].background {
            self.waiting -= 1;
            self.last_done = now;
        }
        if let Some(t) = trig {
            let t = t as usize;
            self.trigger_seen[t] += 1;
            if self.trigger_seen[t] == self.work.triggers[t].needed {
                for i in 0..self.trigger_flows[t].len() {
                    let f = self.trigger_flows[t][i];
                    self.events.schedule(now, EventKind::FlowStart(f));
                }
            }
        }
    }
}

/// Mutable references to two different elements of `v`.
fn pair_mut<T>(v: &mut [T], a: usize, b: usize) -> (&mut T, &mut T) {
    assert_ne!(a, b);
    if a < b {
        let (x, y) = v.split_at_mut(b);
        (&mut x[a], &mut y[0])
    } else {
        let (x, y) = v.split_at_mut(a);
        (&mut y[0], &mut x[b])
    }
}
