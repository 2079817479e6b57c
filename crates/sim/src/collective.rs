//! Collective workloads from the collectives library's own schedules.
//!
//! A collective here is not a model of one: it is the message schedule of
//! `metaroce-coll` ([`metaroce_coll::Schedule`]), derived from the same
//! plans the socket path (`metaroce-collnet`) runs. Every message becomes a
//! flow with the library's sizes and chunks, and every dependency a
//! trigger, so a simulated collective and one over sockets move the same
//! messages in the same order, step for step:
//!
//! - a send starts once the messages it forwards or folds in have arrived
//!   ([`Dependency::Received`]) and any earlier send of the rank it must
//!   outlive has completed ([`Dependency::Sent`]); local computation is
//!   free;
//! - the library's staging-slot window holds message `k` to a peer until
//!   message `k - slots` to it has completed at the sender (the data write
//!   is acknowledged, which in the simulator comes after the receiver has
//!   it) and the receiver could consume it ([`RankSchedule::consume_after`]).
//!   The credit's own trip back (a zero-length write, about half an RTT)
//!   is not simulated: the acknowledgement stands in for it.
//!
//! [`StepTrigger::Sent`] is the simulator's variant for htsim's all-reduce
//! generator, which chains ring steps on `send_done_trigger`: a dependency
//! on a received message counts as met when its *sender* sees it
//! acknowledged, not when the receiver has it.
//!
//! [`RankSchedule::consume_after`]: metaroce_coll::RankSchedule::consume_after

use metaroce_coll::report::PerfCollective;
use metaroce_coll::{
    Algorithm, Collective, CommConfig, DataType, Dependency, MessageId, OpSpec, P2pGroup, ReduceOp,
    Schedule, SpecError,
};

use crate::error::SimError;
use crate::time::Ps;
use crate::workload::{CollKind, FlowSet, FlowSpec, StepTrigger};

/// One collective operation of the library, as a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveWorkload {
    /// Which collective (nccl-tests' names: `all_reduce`, `alltoall`, ...).
    pub collective: PerfCollective,
    /// The library's algorithm, or [`Algorithm::Auto`] for its choice by size.
    pub algorithm: Algorithm,
    /// nccl-tests' size: the larger of a rank's two buffers, in bytes
    /// (all_reduce, broadcast, reduce: the buffer; all_gather: the output;
    /// reduce_scatter: the input; alltoall: what each rank sends in all).
    /// Per-rank blocks are rounded down as nccl-tests does
    /// ([`PerfCollective::counts`]).
    pub bytes: u64,
    /// Broadcast and reduce: the root, a position in the rank list.
    pub root: u32,
    /// Bytes per pipelined chunk; `None` for the library's default (its
    /// staging slot size, [`CommConfig::slot_bytes`]).
    pub chunk_bytes: Option<u64>,
    /// Staging slots per peer (the window of messages in flight on one
    /// connection); `None` for the library's default.
    pub slots: Option<u32>,
    /// When a dependency on a received message counts as met.
    pub step: StepTrigger,
}

impl CollectiveWorkload {
    /// The ring all-reduce of a `bytes` buffer with the library's defaults.
    pub fn ring_allreduce(bytes: u64, step: StepTrigger) -> Self {
        Self {
            collective: PerfCollective::AllReduce,
            algorithm: Algorithm::Ring,
            bytes,
            root: 0,
            chunk_bytes: None,
            slots: None,
            step,
        }
    }

    /// The communicator settings every rank would use: the library's
    /// defaults, with slots big enough for the chunk asked for.
    pub fn config(&self) -> CommConfig {
        let mut c = CommConfig::default();
        if let Some(s) = self.slots {
            c.slots = s;
        }
        if let Some(chunk) = self.chunk_bytes {
            c.slot_bytes = c.slot_bytes.max(chunk.div_ceil(8) * 8);
        }
        c
    }

    /// The operation as rank `rank` of `world` starts it (bytes, so
    /// `uint8` elements: chunks and blocks are exact byte counts).
    pub fn spec(&self, rank: u32, world: u32) -> OpSpec {
        let dtype = DataType::Uint8;
        let counts = self.collective.counts(self.bytes, dtype, world);
        let collective = match self.collective {
            PerfCollective::AllReduce => Collective::AllReduce,
            PerfCollective::AllGather => Collective::AllGather,
            PerfCollective::ReduceScatter => Collective::ReduceScatter,
            PerfCollective::AllToAll => Collective::AllToAll,
            PerfCollective::Broadcast => Collective::Broadcast { root: self.root },
            PerfCollective::Reduce => Collective::Reduce { root: self.root },
            PerfCollective::SendRecv => {
                Collective::SendRecv(P2pGroup::ring_neighbours(rank, world, counts.param_count))
            }
        };
        let mut spec = OpSpec::new(collective, dtype, ReduceOp::Sum, counts.param_count)
            .with_algorithm(self.algorithm);
        spec.chunk_bytes = self.chunk_bytes;
        spec
    }

    /// The library's schedule on `world` ranks.
    pub fn schedule(&self, world: u32) -> Result<Schedule, SpecError> {
        self.check(world)?;
        Schedule::per_rank(world, &self.config(), |r| self.spec(r, world))
    }

    /// Whether the operation can run on `world` ranks, without planning
    /// it: settings, algorithm, root, and data left per rank.
    pub fn check(&self, world: u32) -> Result<(), SpecError> {
        let config = self.config();
        config.validate()?;
        self.algorithm
            .resolve(&self.spec(0, world).collective, self.bytes, world, &config)?;
        if matches!(
            self.collective,
            PerfCollective::Broadcast | PerfCollective::Reduce
        ) && self.root >= world
        {
            return Err(SpecError::Invalid(format!(
                "root {} is not among {world} ranks",
                self.root
            )));
        }
        let counts = self.collective.counts(self.bytes, DataType::Uint8, world);
        if counts.param_count == 0 {
            return Err(SpecError::Invalid(format!(
                "{} bytes leave no data per rank (nccl-tests rounds each of the {world} blocks down to 16 bytes)",
                self.bytes
            )));
        }
        Ok(())
    }

    /// The nccl-tests size column: what busbw is computed from.
    pub fn size_bytes(&self, world: u32) -> u64 {
        self.collective
            .counts(self.bytes, DataType::Uint8, world)
            .size_bytes(DataType::Uint8)
    }

    fn report_kind(&self) -> CollKind {
        match self.collective {
            PerfCollective::AllReduce => CollKind::AllReduce,
            PerfCollective::AllGather => CollKind::AllGather,
            PerfCollective::ReduceScatter => CollKind::ReduceScatter,
            PerfCollective::AllToAll => CollKind::AllToAll,
            PerfCollective::Broadcast => CollKind::Broadcast,
            PerfCollective::Reduce => CollKind::Reduce,
            PerfCollective::SendRecv => CollKind::Flows,
        }
    }
}

/// A flow's completion event, as a sortable key: `flow * 2 + kind`.
#[derive(Clone, Copy)]
enum Event {
    Received = 0,
    Sent = 1,
}

const fn key(flow: u32, e: Event) -> u64 {
    (flow as u64) << 1 | e as u64
}

impl FlowSet {
    /// The collective `w` among `hosts` (rank `i` on `hosts[i]`), starting
    /// at `start`: one flow per message of the library's schedule, started
    /// by triggers on the completions it depends on (see the module
    /// documentation).
    pub fn collective(
        &mut self,
        hosts: &[u32],
        w: &CollectiveWorkload,
        start: Ps,
        name: Option<&str>,
    ) -> Result<(), SimError> {
        let n = hosts.len() as u32;
        let sched = w
            .schedule(n)
            .map_err(|e| SimError::Scenario(format!("{}: {e}", w.collective.name())))?;
        let algorithm = sched.algorithm();
        let default_name = || match (w.collective, algorithm) {
            (PerfCollective::AllReduce, Algorithm::Ring) => format!("ring all-reduce {n}"),
            (c, a) => format!("{} {a} {n}", c.name()),
        };
        let g = self.group(
            name.map_or_else(default_name, str::to_string),
            w.report_kind(),
            n,
            w.size_bytes(n),
        );
        // Flows go rank by rank in plan order: a message's flow is its
        // rank's first flow plus its position there.
        let first: Vec<u32> = sched
            .ranks()
            .iter()
            .scan(self.flows.len() as u32, |next, r| {
                let f = *next;
                *next += r.sends().len() as u32;
                Some(f)
            })
            .collect();
        let flow_of = |id: MessageId| -> u32 {
            let pos = sched
                .rank(id.from)
                .send_position(id.to, id.index)
                .expect("a schedule's dependencies name its own messages");
            first[id.from as usize] + pos as u32
        };
        let event_of = |d: Dependency| match d {
            Dependency::Received(id) => match w.step {
                StepTrigger::Received => key(flow_of(id), Event::Received),
                StepTrigger::Sent => key(flow_of(id), Event::Sent),
            },
            Dependency::Sent(id) => key(flow_of(id), Event::Sent),
        };
        // (event, trigger waiting for it), gathered then wired.
        let mut waits: Vec<(u64, u32)> = Vec::new();
        let mut events: Vec<u64> = Vec::new();
        for (r, rs) in sched.ranks().iter().enumerate() {
            for m in rs.sends() {
                if m.bytes == 0 {
                    return Err(SimError::Scenario(format!(
                        "{}: a zero-length message (only barriers send them)",
                        w.collective.name()
                    )));
                }
                events.clear();
                events.extend(rs.after(m).iter().map(|&d| event_of(d)));
                if let Some(p) = sched.slot_predecessor(m.id) {
                    events.push(key(flow_of(p), Event::Sent));
                    let receipt = sched
                        .receipt(p)
                        .expect("a schedule's messages all have receivers");
                    let receiver = sched.rank(p.to);
                    events.extend(receiver.consume_after(receipt).iter().map(|&d| event_of(d)));
                }
                events.sort_unstable();
                events.dedup();
                let mut f = FlowSpec::at(hosts[r], hosts[m.id.to as usize], m.bytes, start);
                f.group = Some(g);
                if !events.is_empty() {
                    let t = self.trigger(events.len() as u32);
                    f.start = None;
                    f.trigger = Some(t);
                    waits.extend(events.iter().map(|&e| (e, t)));
                }
                self.flows.push(f);
            }
        }
        drop(sched);
        // A flow names one trigger per event: one waiter is named directly,
        // several through a relay trigger that feeds them all (relays are
        // the newest triggers, so the feeds stay sorted).
        waits.sort_unstable();
        for same in waits.chunk_by(|a, b| a.0 == b.0) {
            let t = match same {
                [(_, t)] => *t,
                _ => {
                    let relay = self.trigger(1);
                    self.feeds.extend(same.iter().map(|&(_, t)| (relay, t)));
                    relay
                }
            };
            let flow = &mut self.flows[(same[0].0 >> 1) as usize];
            if same[0].0 & 1 == Event::Sent as u64 {
                flow.on_send = Some(t);
            } else {
                flow.on_recv = Some(t);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flows(w: &CollectiveWorkload, hosts: &[u32]) -> FlowSet {
        let mut s = FlowSet::default();
        s.collective(hosts, w, 0, None).unwrap();
        s
    }

    #[test]
    fn ring_allreduce_chains_steps_on_the_received_data() {
        let s = flows(
            &CollectiveWorkload::ring_allreduce(4096, StepTrigger::Received),
            &[10, 11, 12, 13],
        );
        // 4 ranks × 2(n-1) = 6 steps of 1024 bytes, rank by rank.
        assert_eq!(s.flows.len(), 4 * 6);
        assert!(s.flows.iter().all(|f| f.bytes == 1024));
        assert_eq!(s.groups[0].name, "ring all-reduce 4");
        assert_eq!(s.groups[0].bytes, 4096);
        // Rank 1's step 1 (flow 7, 11 -> 12) waits for rank 0's step 0
        // (flow 0, 10 -> 11) to arrive, and for nothing else.
        let (r0s0, r1s1) = (&s.flows[0], &s.flows[7]);
        assert_eq!((r0s0.src, r0s0.dst), (10, 11));
        assert_eq!((r1s1.src, r1s1.dst), (11, 12));
        assert_eq!(r0s0.start, Some(0));
        assert!(r1s1.start.is_none());
        assert_eq!(r1s1.trigger, r0s0.on_recv);
        assert_eq!(s.triggers[r1s1.trigger.unwrap() as usize].needed, 1);
        // Step 4 also waits for the slot of step 0 (4 slots per peer): its
        // own send of step 0 acknowledged.
        let r1s4 = &s.flows[6 + 4];
        let t = r1s4.trigger.unwrap();
        assert_eq!(s.triggers[t as usize].needed, 2);
        assert_eq!(s.flows[6].on_send, Some(t));
    }

    #[test]
    fn sent_variant_waits_for_the_previous_hop_s_acknowledgement() {
        let s = flows(
            &CollectiveWorkload::ring_allreduce(4096, StepTrigger::Sent),
            &[0, 1, 2, 3],
        );
        // Rank 0's step 0 is acknowledged: it feeds rank 1's step 1 and
        // rank 0's own step 4 (the slot), through a relay.
        let relay = s.flows[0].on_send.unwrap();
        assert!(s.flows[0].on_recv.is_none());
        let fed: Vec<u32> = s
            .feeds
            .iter()
            .filter(|&&(t, _)| t == relay)
            .map(|&(_, f)| f)
            .collect();
        assert_eq!(fed.len(), 2);
        assert!(fed.contains(&s.flows[7].trigger.unwrap()));
        assert!(fed.contains(&s.flows[4].trigger.unwrap()));
    }

    #[test]
    fn chunks_follow_the_chunk_size() {
        let mut w = CollectiveWorkload::ring_allreduce(1 << 20, StepTrigger::Received);
        w.chunk_bytes = Some(32 << 10);
        let s = flows(&w, &[0, 1, 2, 3]);
        // Blocks of 256 KiB in 8 chunks: 8 rounds of 6 steps per rank.
        assert_eq!(s.flows.len(), 4 * 6 * 8);
        assert!(s.flows.iter().all(|f| f.bytes == 32 << 10));
    }

    #[test]
    fn other_collectives_and_algorithms() {
        let hosts: Vec<u32> = (0..8).collect();
        for (c, a, bytes, sent_per_rank) in [
            (PerfCollective::AllGather, Algorithm::Auto, 8 << 10, 7 << 10),
            (
                PerfCollective::ReduceScatter,
                Algorithm::Ring,
                8 << 10,
                7 << 10,
            ),
            (PerfCollective::AllToAll, Algorithm::Auto, 8 << 10, 7 << 10),
            (
                PerfCollective::AllReduce,
                Algorithm::RecursiveDoubling,
                1024,
                3 * 1024,
            ),
            // Halving-doubling sends what the ring sends: 2 (p-1)/p of it.
            (
                PerfCollective::AllReduce,
                Algorithm::HalvingDoubling,
                8 << 10,
                14 << 10,
            ),
            (PerfCollective::SendRecv, Algorithm::Auto, 1024, 1024),
        ] {
            let w = CollectiveWorkload {
                collective: c,
                algorithm: a,
                ..CollectiveWorkload::ring_allreduce(bytes, StepTrigger::Received)
            };
            let s = flows(&w, &hosts);
            for h in 0..8 {
                let sent: u64 = s.flows.iter().filter(|f| f.src == h).map(|f| f.bytes).sum();
                assert_eq!(sent, sent_per_rank, "{c:?} {a}");
            }
        }
        // Broadcast from rank 2 by tree: every other rank receives it once.
        let w = CollectiveWorkload {
            collective: PerfCollective::Broadcast,
            algorithm: Algorithm::Tree,
            root: 2,
            ..CollectiveWorkload::ring_allreduce(4096, StepTrigger::Received)
        };
        let s = flows(&w, &hosts);
        for h in 0..8 {
            let got: u64 = s.flows.iter().filter(|f| f.dst == h).map(|f| f.bytes).sum();
            assert_eq!(got, if h == 2 { 0 } else { 4096 });
        }
        assert_eq!(s.groups[0].name, "broadcast tree 8");
    }

    #[test]
    fn bad_requests_are_errors() {
        let hosts = [0, 1, 2];
        let mut s = FlowSet::default();
        let tree_gather = CollectiveWorkload {
            collective: PerfCollective::AllGather,
            algorithm: Algorithm::Tree,
            ..CollectiveWorkload::ring_allreduce(4096, StepTrigger::Received)
        };
        assert_eq!(
            s.collective(&hosts, &tree_gather, 0, None)
                .unwrap_err()
                .to_string(),
            "all_gather: all_gather has no tree algorithm"
        );
        let far_root = CollectiveWorkload {
            collective: PerfCollective::Broadcast,
            root: 3,
            ..tree_gather.clone()
        };
        assert!(s.collective(&hosts, &far_root, 0, None).is_err());
        let tiny = CollectiveWorkload {
            collective: PerfCollective::AllGather,
            algorithm: Algorithm::Auto,
            bytes: 20,
            ..tree_gather
        };
        assert!(s.collective(&hosts, &tiny, 0, None).is_err());
    }
}
