//! Driving the workload: one channel per ordered host pair, each flow
//! posted as one message at its start time or when its trigger fires, and
//! completions counted and fed to the triggers that wait on them (how
//! dependent steps such as a ring all-reduce's chain).

use super::Sim;
use crate::error::SimError;
use crate::event::EventKind;
use crate::time::Ps;
use crate::transport::{ChannelPlan, MessageEvent, Transport, TransportFactory};

/// A channel counted at setup that its first message has not opened yet.
const NOT_OPEN: u32 = u32::MAX;

impl<F: TransportFactory> Sim<F> {
    /// Count the messages every channel will carry, count the flows
    /// awaited, and schedule or attach every flow's start. Channels open
    /// with their first message and close after their last, so only the
    /// pairs in use hold state (a 1024-rank all-to-all has a million).
    pub(super) fn setup_flows(&mut self) -> Result<(), SimError> {
        let triggers = self.work.triggers.len();
        if let Some(&(trigger, fed)) = self
            .work
            .feeds
            .iter()
            .find(|&&(t, f)| t as usize >= triggers || f as usize >= triggers)
        {
            return Err(SimError::UnknownFedTrigger { trigger, fed });
        }
        if !self.work.feeds.is_sorted_by_key(|&(t, _)| t) {
            return Err(SimError::UnsortedFeeds);
        }
        for i in 0..self.work.flows.len() {
            let f = &self.work.flows[i];
            let (src, dst) = (f.src, f.dst);
            if src >= self.topo.hosts || dst >= self.topo.hosts || src == dst {
                return Err(SimError::FlowHosts { flow: i, src, dst });
            }
            // One channel per ordered (src, dst) pair, shared by its flows:
            // (not yet open, messages it will carry).
            let channel = self.hosts[src as usize]
                .channels
                .entry(dst)
                .or_insert((NOT_OPEN, 0));
            channel.1 += 1;
            if channel.1 == 1 {
                self.hosts[dst as usize].senders_to_me += 1;
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
        let (mut ch, messages) = host.channels[&dst];
        if ch == NOT_OPEN {
            let plan = ChannelPlan {
                messages,
                senders_to_receiver: self.hosts[dst as usize].senders_to_me,
            };
            let (a, b) = pair_mut(&mut self.hosts, src as usize, dst as usize);
            match self
                .factory
                .open_channel(now, &mut a.transport, src, &mut b.transport, dst, plan)
            {
                Ok(c) => {
                    ch = c;
                    a.channels.insert(dst, (c, messages));
                }
                Err(e) => {
                    self.error = Some(e.into());
                    return;
                }
            }
        }
        let host = &mut self.hosts[src as usize];
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
        if finished_now {
            if !self.work.flows[tag as usize].background {
                self.waiting -= 1;
                self.last_done = now;
            }
            self.channel_message_done(tag);
        }
        if let Some(t) = trig {
            self.activate_trigger(now, t);
        }
    }

    /// One activation of trigger `t`: on the one that completes it, start
    /// its flows and activate the triggers it feeds (in order, depth
    /// first; a trigger fires once, so even a cycle ends).
    fn activate_trigger(&mut self, now: Ps, t: u32) {
        let t = t as usize;
        self.trigger_seen[t] += 1;
        if self.trigger_seen[t] != self.work.triggers[t].needed {
            return;
        }
        for i in 0..self.trigger_flows[t].len() {
            let f = self.trigger_flows[t][i];
            self.events.schedule(now, EventKind::FlowStart(f));
        }
        let feeds = &self.work.feeds;
        let first = feeds.partition_point(|&(from, _)| (from as usize) < t);
        for i in first..feeds.len() {
            let (from, fed) = self.work.feeds[i];
            if from as usize != t {
                break;
            }
            self.activate_trigger(now, fed);
        }
    }
}

impl<F: TransportFactory> Sim<F> {
    /// Flow `tag` finished at both ends: once its channel has no message
    /// left, close it on both hosts, so a run of a million flows (a
    /// 1024-rank all-to-all) holds state only for the ones in progress.
    fn channel_message_done(&mut self, tag: u32) {
        let (src, dst) = {
            let f = &self.work.flows[tag as usize];
            (f.src, f.dst)
        };
        let Some(entry) = self.hosts[src as usize].channels.get_mut(&dst) else {
            return;
        };
        entry.1 -= 1;
        if entry.1 > 0 {
            return;
        }
        let ch = entry.0;
        self.hosts[src as usize].transport.close_send_channel(ch);
        self.hosts[dst as usize].transport.close_recv_channel(src);
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
