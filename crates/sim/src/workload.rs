//! Workloads: flows with start times or triggers.
//!
//! Everything becomes a [`FlowSet`]: flows (src, dst, bytes) that start at
//! a time or when a trigger fires, and triggers that fire once enough flows
//! have sent or received (htsim's connection-matrix triggers, which is also
//! how a collective's step waits for the data it forwards: the collectives
//! themselves are the library's schedules, in [`crate::collective`]).

use crate::error::SimError;
use crate::time::{Ps, us_to_ps};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// One flow (a message from `src` to `dst`).
#[derive(Debug, Clone, PartialEq)]
pub struct FlowSpec {
    /// Sending host.
    pub src: u32,
    /// Receiving host.
    pub dst: u32,
    /// Message bytes.
    pub bytes: u64,
    /// Start time, or `None` to wait for `trigger`.
    pub start: Option<Ps>,
    /// Trigger that starts it.
    pub trigger: Option<u32>,
    /// Trigger activated when the sender completes.
    pub on_send: Option<u32>,
    /// Trigger activated when all data is received.
    pub on_recv: Option<u32>,
    /// Collective it belongs to.
    pub group: Option<u32>,
    /// Background traffic: not waited for at the end of the run.
    pub background: bool,
}

impl FlowSpec {
    /// A flow starting at `start`.
    pub fn at(src: u32, dst: u32, bytes: u64, start: Ps) -> Self {
        Self {
            src,
            dst,
            bytes,
            start: Some(start),
            trigger: None,
            on_send: None,
            on_recv: None,
            group: None,
            background: false,
        }
    }
}

/// A trigger: fires once `needed` activations arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerSpec {
    /// Activations needed (1 = oneshot; barrier = the flows feeding it).
    pub needed: u32,
}

/// When a collective's dependency on a received message counts as met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StepTrigger {
    /// When the message has arrived at the rank that waits for it (the
    /// library's data dependency: it must reduce before it forwards).
    #[default]
    Received,
    /// When the message's sender has it acknowledged (htsim's all-reduce
    /// generator chains ring steps on `send_done_trigger`): a simulator
    /// variant, not something the library does.
    Sent,
}

/// Which nccl-tests formula a collective's bandwidth follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollKind {
    /// all_reduce: busbw = algbw * 2(n-1)/n.
    AllReduce,
    /// alltoall: busbw = algbw * (n-1)/n.
    AllToAll,
    /// reduce_scatter: busbw = algbw * (n-1)/n.
    ReduceScatter,
    /// all_gather: busbw = algbw * (n-1)/n.
    AllGather,
    /// broadcast: busbw = algbw.
    Broadcast,
    /// reduce: busbw = algbw.
    Reduce,
    /// sendrecv-like point to point sets: busbw = algbw.
    Flows,
}

/// A collective (or named group of flows) reported as one operation.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSpec {
    /// Name in reports.
    pub name: String,
    /// Formula.
    pub kind: CollKind,
    /// Ranks taking part.
    pub ranks: u32,
    /// nccl-tests S, per rank: the bytes one rank's buffer holds (all-reduce:
    /// the buffer; all-to-all: what each rank sends, count x typesize x n;
    /// a permutation: one flow; an incast: what the receiver takes in; flow
    /// files: every flow's bytes together).
    pub bytes: u64,
    /// An incast's receiver (its bottleneck queue is watched).
    pub receiver: Option<u32>,
}

/// Flows, triggers and groups of one scenario.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlowSet {
    /// Flows; a flow's index is its tag.
    pub flows: Vec<FlowSpec>,
    /// Triggers.
    pub triggers: Vec<TriggerSpec>,
    /// `(trigger, trigger it feeds)`, sorted: when the first fires it
    /// activates the second, in this order. How one completion releases
    /// several waiters (a flow names one trigger per event, and a
    /// collective's received chunk may be forwarded to several children
    /// and also free a staging slot). Kept apart from [`TriggerSpec`] so
    /// the many triggers that feed nothing cost nothing.
    pub feeds: Vec<(u32, u32)>,
    /// Groups.
    pub groups: Vec<GroupSpec>,
}

impl FlowSet {
    pub(crate) fn trigger(&mut self, needed: u32) -> u32 {
        self.triggers.push(TriggerSpec { needed });
        self.triggers.len() as u32 - 1
    }

    pub(crate) fn group(&mut self, name: String, kind: CollKind, ranks: u32, bytes: u64) -> u32 {
        self.groups.push(GroupSpec {
            name,
            kind,
            ranks,
            bytes,
            receiver: None,
        });
        self.groups.len() as u32 - 1
    }

    /// A random permutation (derangement) among `hosts`: every host sends
    /// `bytes` to one other and receives from one.
    pub fn permutation(
        &mut self,
        hosts: &[u32],
        bytes: u64,
        start: Ps,
        seed: u64,
        name: Option<&str>,
    ) {
        let n = hosts.len() as u32;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut dst: Vec<u32> = (0..n).collect();
        // Sattolo's algorithm: a single cycle, so no host sends to itself.
        for i in (1..n as usize).rev() {
            let j = (rng.next_u64() % i as u64) as usize;
            dst.swap(i, j);
        }
        let g = self.group(
            name.map_or_else(|| format!("permutation {n}"), str::to_string),
            CollKind::Flows,
            n,
            bytes,
        );
        for (s, &d) in dst.iter().enumerate() {
            let mut f = FlowSpec::at(hosts[s], hosts[d as usize], bytes, start);
            f.group = Some(g);
            self.flows.push(f);
        }
    }

    /// Every host of `senders` sends `bytes` to `receiver`.
    pub fn incast(
        &mut self,
        senders: &[u32],
        receiver: u32,
        bytes: u64,
        start: Ps,
        name: Option<&str>,
    ) {
        let n = senders.len() as u32;
        let g = self.group(
            name.map_or_else(|| format!("incast {n}:1"), str::to_string),
            CollKind::Flows,
            n + 1,
            bytes * u64::from(n),
        );
        self.groups[g as usize].receiver = Some(receiver);
        for &s in senders {
            let mut f = FlowSpec::at(s, receiver, bytes, start);
            f.group = Some(g);
            self.flows.push(f);
        }
    }

    /// All-to-all among `ranks`: every rank sends `bytes` to every other.
    /// `serial`: each rank sends to rank+1, rank+2, ... one after another
    /// (each waiting for the previous send to complete), as NCCL's
    /// grouped send/recv does on a bounded number of channels.
    pub fn all_to_all(
        &mut self,
        ranks: &[u32],
        bytes: u64,
        start: Ps,
        serial: bool,
        name: Option<&str>,
    ) {
        let n = ranks.len() as u32;
        let g = self.group(
            name.map_or_else(|| format!("all-to-all {n}"), str::to_string),
            CollKind::AllToAll,
            n,
            bytes * u64::from(n),
        );
        for (i, &src) in ranks.iter().enumerate() {
            let mut prev: Option<u32> = None;
            for k in 1..n as usize {
                let dst = ranks[(i + k) % n as usize];
                let mut f = FlowSpec::at(src, dst, bytes, start);
                f.group = Some(g);
                if serial {
                    if let Some(t) = prev {
                        f.start = None;
                        f.trigger = Some(t);
                    }
                    if k + 1 < n as usize {
                        let t = self.trigger(1);
                        f.on_send = Some(t);
                        prev = Some(t);
                    }
                }
                self.flows.push(f);
            }
        }
    }

    /// Latency probes: host `hosts[2i]` sends host `hosts[2i+1]` `count`
    /// messages of each of `sizes`, one every `interval` from `start` (one
    /// size after the other), each its own group per size (`probe 8 B`) so
    /// each size's latency percentiles stand apart. The pairs should be
    /// idle otherwise: what a probe measures is the fabric's queueing.
    pub fn probes(
        &mut self,
        hosts: &[u32],
        sizes: &[u64],
        count: u32,
        interval: Ps,
        start: Ps,
        name: Option<&str>,
    ) {
        let pairs: Vec<(u32, u32)> = hosts.chunks_exact(2).map(|p| (p[0], p[1])).collect();
        let mut t = start;
        for &size in sizes {
            let label = match name {
                Some(n) => format!("{n} {size} B"),
                None => format!("probe {size} B"),
            };
            let g = self.group(label, CollKind::Flows, 2 * pairs.len() as u32, size);
            for _ in 0..count {
                for &(a, b) in &pairs {
                    let mut f = FlowSpec::at(a, b, size, t);
                    f.group = Some(g);
                    self.flows.push(f);
                }
                t += interval;
            }
        }
    }

    /// Background load: Poisson arrivals of `bytes` flows between random
    /// pairs, at `load` of every host's `rate_bps`, from `start` to `until`.
    #[allow(clippy::too_many_arguments)]
    pub fn background(
        &mut self,
        hosts: &[u32],
        load: f64,
        rate_bps: u64,
        bytes: u64,
        start: Ps,
        until: Ps,
        seed: u64,
    ) {
        let n = hosts.len() as u32;
        if n < 2 || load <= 0.0 {
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xb4c6_0000);
        // Flows per second over all hosts.
        let per_s = load * rate_bps as f64 * f64::from(n) / (bytes as f64 * 8.0);
        let mean_gap_ps = 1e12 / per_s;
        let mut t = start as f64;
        loop {
            let u = ((rng.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            t += -u.ln() * mean_gap_ps;
            if t >= until as f64 {
                break;
            }
            let src = (rng.next_u64() % u64::from(n)) as u32;
            let mut dst = (rng.next_u64() % u64::from(n - 1)) as u32;
            if dst >= src {
                dst += 1;
            }
            let mut f = FlowSpec::at(hosts[src as usize], hosts[dst as usize], bytes, t as Ps);
            f.background = true;
            self.flows.push(f);
        }
    }

    /// Flows from CSV lines `src,dst,bytes,start_us` (a header line and `#`
    /// comments are skipped).
    pub fn from_csv(&mut self, text: &str, hosts: u32) -> Result<(), SimError> {
        let g = self.groups.len() as u32;
        let mut total = 0;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty()
                || line.starts_with('#')
                || (i == 0 && line.starts_with(|c: char| c.is_alphabetic()))
            {
                continue;
            }
            let cols: Vec<&str> = line.split(',').map(str::trim).collect();
            let bad = || SimError::FlowFileLine {
                line: i + 1,
                problem: "expected src,dst,bytes,start_us".into(),
            };
            if cols.len() < 3 {
                return Err(bad());
            }
            let src: u32 = cols[0].parse().map_err(|_| bad())?;
            let dst: u32 = cols[1].parse().map_err(|_| bad())?;
            let bytes: u64 = cols[2].parse().map_err(|_| bad())?;
            let start_us: f64 = cols
                .get(3)
                .map_or(Ok(0.0), |s| s.parse())
                .map_err(|_| bad())?;
            check_hosts(src, dst, hosts, i + 1)?;
            let mut f = FlowSpec::at(src, dst, bytes, us_to_ps(start_us));
            f.group = Some(g);
            total += bytes;
            self.flows.push(f);
        }
        self.group("csv flows".into(), CollKind::Flows, hosts, total);
        Ok(())
    }

    /// Flows from an htsim connection matrix (`.cm`): `Nodes N`,
    /// `Connections C`, `Triggers T`, then `src->dst [id I] [start US]
    /// [size B] [trigger K] [send_done_trigger K] [recv_done_trigger K]
    /// [prio P]` lines and `trigger id K oneshot|multishot|barrier` lines.
    /// Start times are in microseconds.
    pub fn from_cm(&mut self, text: &str, hosts: u32) -> Result<(), SimError> {
        let g = self.groups.len() as u32;
        let first_flow = self.flows.len();
        // The matrix's trigger ids to ours: a hash map, so loading is
        // linear in the matrix (a scan per trigger made a 32 k-trigger
        // all-reduce matrix quadratic).
        let mut trig_ids: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
        let mut barrier: Vec<u32> = Vec::new();
        let mut total = 0;
        let mut map_trigger = |set: &mut Self, id: u64| -> u32 {
            *trig_ids.entry(id).or_insert_with(|| set.trigger(1))
        };
        for (i, line) in text.lines().enumerate() {
            let lineno = i + 1;
            let toks: Vec<&str> = line.split_whitespace().collect();
            let Some(&first) = toks.first() else { continue };
            let bad = |what: &str| SimError::FlowFileLine {
                line: lineno,
                problem: what.into(),
            };
            match first {
                "Nodes" => {
                    let n: u32 = toks
                        .get(1)
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| bad("bad Nodes"))?;
                    if n > hosts {
                        return Err(bad(&format!(
                            "matrix has {n} nodes, topology {hosts} hosts"
                        )));
                    }
                }
                "Connections" | "Triggers" | "Failures" => {}
                "trigger" => {
                    // trigger id K kind
                    let id: u64 = toks
                        .get(2)
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| bad("bad trigger id"))?;
                    let t = map_trigger(self, id);
                    if toks.get(3) == Some(&"barrier") {
                        barrier.push(t);
                    }
                }
                _ if first.contains("->") => {
                    let (s, d) = first.split_once("->").ok_or_else(|| bad("bad src->dst"))?;
                    let src: u32 = s.parse().map_err(|_| bad("bad src"))?;
                    let dst: u32 = d.parse().map_err(|_| bad("bad dst"))?;
                    check_hosts(src, dst, hosts, lineno)?;
                    let mut f = FlowSpec::at(src, dst, 0, 0);
                    f.group = Some(g);
                    let mut it = toks[1..].iter();
                    while let Some(&key) = it.next() {
                        let val = it
                            .next()
                            .ok_or_else(|| bad(&format!("{key} without value")))?;
                        let num = || {
                            val.parse::<f64>()
                                .map_err(|_| bad(&format!("bad {key} value '{val}'")))
                        };
                        match key {
                            "id" | "prio" => {}
                            "start" => f.start = Some(us_to_ps(num()?)),
                            "size" => f.bytes = num()? as u64,
                            "trigger" => {
                                f.trigger = Some(map_trigger(self, num()? as u64));
                                f.start = None;
                            }
                            "send_done_trigger" => {
                                f.on_send = Some(map_trigger(self, num()? as u64))
                            }
                            "recv_done_trigger" => {
                                f.on_recv = Some(map_trigger(self, num()? as u64))
                            }
                            _ => return Err(bad(&format!("unknown field '{key}'"))),
                        }
                    }
                    if f.bytes == 0 {
                        return Err(bad("flow without size"));
                    }
                    total += f.bytes;
                    self.flows.push(f);
                }
                _ => return Err(bad(&format!("unknown line '{first}'"))),
            }
        }
        if !barrier.is_empty() {
            // A barrier fires once every flow feeding it is done: count the
            // feeders of every trigger in one pass over the flows.
            let mut feeders = vec![0u32; self.triggers.len()];
            for f in &self.flows[first_flow..] {
                if let Some(t) = f.on_send {
                    feeders[t as usize] += 1;
                }
                if let Some(t) = f.on_recv.filter(|&t| f.on_send != Some(t)) {
                    feeders[t as usize] += 1;
                }
            }
            for t in barrier {
                self.triggers[t as usize].needed = feeders[t as usize].max(1);
            }
        }
        self.group("connection matrix".into(), CollKind::Flows, hosts, total);
        Ok(())
    }
}

fn check_hosts(src: u32, dst: u32, hosts: u32, line: usize) -> Result<(), SimError> {
    let bad = |problem: String| Err(SimError::FlowFileLine { line, problem });
    if src >= hosts || dst >= hosts {
        return bad(format!(
            "host index out of range (topology has {hosts} hosts)"
        ));
    }
    if src == dst {
        return bad("flow from a host to itself".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_derangement() {
        let mut s = FlowSet::default();
        let hosts: Vec<u32> = (0..128).collect();
        s.permutation(&hosts, 1000, 0, 7, None);
        let mut seen = [false; 128];
        for f in &s.flows {
            assert_ne!(f.src, f.dst);
            assert!(!seen[f.dst as usize]);
            seen[f.dst as usize] = true;
        }
    }

    #[test]
    fn cm_parses_triggers() {
        let cm = "Nodes 4\nConnections 2\nTriggers 1\n0->1 id 1 start 0 size 1000 send_done_trigger 1\n1->2 id 2 trigger 1 size 2000\ntrigger id 1 oneshot\n";
        let mut s = FlowSet::default();
        s.from_cm(cm, 4).unwrap();
        assert_eq!(s.flows.len(), 2);
        assert_eq!(s.flows[1].trigger, s.flows[0].on_send);
        assert_eq!(
            s.from_cm("0->9 size 5", 4).unwrap_err().to_string(),
            "line 1: host index out of range (topology has 4 hosts)"
        );
    }
}
