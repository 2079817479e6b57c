//! Bootstrap over TCP: the ranks find each other through the root
//! (rank 0), learn what they need about their peers, connect one QP per
//! peer, and start together.
//!
//! The messages are the connection manager's frames (`metaroce-cm`), with
//! bodies of this module:
//!
//! 1. every rank `r > 0` connects to the root (retrying until the root
//!    listens, up to the timeout), starts its device on the address it
//!    reached the root from (or its host-file address), builds its QPs in
//!    INIT with receives posted, and sends `Hello` with a [`Join`] (rank,
//!    world, the communicator settings, device IP, pid, host) and a
//!    `metaroce_cm::Endpoint` whose `qpns[q]` is its QP toward rank `q`
//!    and whose `buf` is its staging region;
//! 2. the root waits for all `world - 1` of them. A rank that never shows
//!    up within the timeout is an error naming it, on the root and (by an
//!    `Error` frame) on every rank that did; a rank whose settings differ
//!    from the root's is refused, and the job with it;
//! 3. the root sends each rank an `Accept` with a [`Roster`]: for every
//!    peer, its device address, MTU, session id, staging region and the
//!    number of *its* QP toward this rank — O(world) per rank;
//! 4. every rank connects its QPs (RTR, RTS) and says `Done`/`ready`; when
//!    all have, the root answers `Report`/`go` to each, and the
//!    connections stay open as the control channel ([`crate::control`]).
//!
//! Rank 0 also takes part (its device binds on the root address's IP).

use crate::comm::{Member, NetComm};
use crate::control::{Control, Stage};
use crate::rig::{self, PeerAddr, Rig};
use crate::{CollNetError, Job, NetConfig};
use metaroce_cm::{self as cm, Endpoint, Hello, MsgType, RemoteBuf};
use metaroce_coll::{CommConfig, Rank};
use serde::{Deserialize, Serialize};
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The `test` name of a bootstrap `Hello`.
const HELLO_TEST: &str = "coll-bootstrap";

/// The settings every rank must share, as they travel.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct SharedSettings {
    pub(crate) slots: u32,
    pub(crate) slot_bytes: u64,
    pub(crate) small_allreduce_bytes: u64,
    pub(crate) small_broadcast_bytes: u64,
}

impl From<&CommConfig> for SharedSettings {
    fn from(c: &CommConfig) -> Self {
        Self {
            slots: c.slots,
            slot_bytes: c.slot_bytes,
            small_allreduce_bytes: c.small_allreduce_bytes,
            small_broadcast_bytes: c.small_broadcast_bytes,
        }
    }
}

/// A rank's request to join (the `params` of its `Hello`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Join {
    pub(crate) rank: Rank,
    pub(crate) world: u32,
    pub(crate) settings: SharedSettings,
    /// The IP the rank's device is bound to.
    pub(crate) ip: IpAddr,
    pub(crate) pid: u32,
    pub(crate) host: String,
    /// This rank's host runs more ranks than it has cores (its own view;
    /// the root combines them into [`Roster::ranks_share_cores`]).
    #[serde(default)]
    pub(crate) shares_cores: bool,
}

/// One peer as a rank needs it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct PeerEntry {
    pub(crate) rank: Rank,
    pub(crate) ip: IpAddr,
    pub(crate) device_port: u16,
    pub(crate) mtu: u32,
    /// The peer's QP toward the receiving rank.
    pub(crate) qpn: u32,
    pub(crate) session_id: u64,
    pub(crate) staging: RemoteBuf,
    pub(crate) pid: u32,
    pub(crate) host: String,
    /// The peer takes data packets without ICRC.
    #[serde(default)]
    pub(crate) icrc_omission: bool,
}

/// The root's answer to a rank: every peer (and the rank itself, `qpn` 0).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Roster {
    pub(crate) entries: Vec<PeerEntry>,
    /// Some rank shares its CPU cores with other ranks: every rank's
    /// communicator then sets `CommConfig::ranks_share_cores`, so that all
    /// choose the same algorithms (each rank only knows its own host).
    #[serde(default)]
    pub(crate) ranks_share_cores: bool,
}

fn boot_err(what: impl Into<String>) -> CollNetError {
    CollNetError::Bootstrap(what.into())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// This rank's endpoint for the roster: its QP numbers by peer rank.
fn local_endpoint(rig: &Rig, cfg: &NetConfig) -> Endpoint {
    Endpoint {
        device_port: rig.dev.addr().port(),
        path_port_span: rig::device_paths(cfg, rig.dev.addr().ip()) as u16,
        mtu: rig::device_mtu(cfg, rig.dev.addr().ip()),
        qpns: rig
            .qps
            .iter()
            .map(|q| q.map_or(0, |q| q.qp_num()))
            .collect(),
        buf: rig.staging.map_or(
            RemoteBuf {
                addr: 0,
                rkey: 0,
                len: 0,
            },
            |m| RemoteBuf {
                addr: m.addr,
                rkey: m.rkey,
                len: m.length,
            },
        ),
        session_id: rig.dev.with(|ctx, _| ctx.session_id()),
        // Collectives run unauthenticated: there is no job secret to confirm.
        key_confirm: None,
        setup_grant_mbps: None,
        // Unauthenticated, so the UDP checksum alone can cover payloads.
        icrc_omission: cfg.icrc_omission,
        auth: "none".into(),
    }
}

fn entry_of(rank: Rank, join: &Join, ep: &Endpoint, toward: Rank) -> PeerEntry {
    PeerEntry {
        rank,
        ip: join.ip,
        device_port: ep.device_port,
        mtu: ep.mtu,
        qpn: ep.qpns.get(toward as usize).copied().unwrap_or(0),
        session_id: ep.session_id,
        staging: ep.buf,
        pid: join.pid,
        host: join.host.clone(),
        icrc_omission: ep.icrc_omission,
    }
}

/// Builds the communicator from the roster once the QPs are connected.
fn finish_comm(
    rig: Rig,
    roster: &Roster,
    control: Control,
    cfg: &NetConfig,
) -> Result<NetComm, CollNetError> {
    let world = rig.comm.world() as usize;
    let mut peers = vec![None; world];
    let mut members = Vec::with_capacity(world);
    for e in &roster.entries {
        members.push(Member {
            rank: e.rank,
            pid: e.pid,
            host: e.host.clone(),
            device: SocketAddr::new(e.ip, e.device_port),
        });
        if e.rank != rig.comm.rank() {
            peers[e.rank as usize] = Some(PeerAddr {
                device: SocketAddr::new(e.ip, e.device_port),
                mtu: e.mtu,
                qpn: e.qpn,
                session_id: e.session_id,
                staging: e.staging,
                icrc_omission: e.icrc_omission,
            });
        }
    }
    members.sort_by_key(|m| m.rank);
    let mut rig = rig;
    rig.comm.set_ranks_share_cores(roster.ranks_share_cores);
    Ok(NetComm::new(rig, peers, control, members, cfg))
}

fn connect_peers(rig: &Rig, roster: &Roster, cfg: &NetConfig) -> Result<(), CollNetError> {
    for e in &roster.entries {
        if e.rank == rig.comm.rank() {
            continue;
        }
        rig::connect(
            rig,
            cfg,
            e.rank,
            &PeerAddr {
                device: SocketAddr::new(e.ip, e.device_port),
                mtu: e.mtu,
                qpn: e.qpn,
                session_id: e.session_id,
                staging: e.staging,
                icrc_omission: e.icrc_omission,
            },
        )?;
    }
    Ok(())
}

/// Joins the job: bootstrap, QPs connected, every rank ready.
pub fn connect(job: &Job, cfg: &NetConfig) -> Result<NetComm, CollNetError> {
    cfg.comm.validate().map_err(|e| boot_err(e.to_string()))?;
    if job.rank >= job.world {
        return Err(CollNetError::Job(format!(
            "rank {} is not in a world of {}",
            job.rank, job.world
        )));
    }
    if job.world == 1 {
        let ip = job.bind_ip.unwrap_or(job.root.ip());
        let rig = rig::rig(0, 1, cfg, ip)?;
        let me = Roster {
            entries: vec![PeerEntry {
                rank: 0,
                ip,
                device_port: rig.dev.addr().port(),
                mtu: rig::device_mtu(cfg, ip),
                qpn: 0,
                session_id: 0,
                staging: RemoteBuf {
                    addr: 0,
                    rkey: 0,
                    len: 0,
                },
                pid: std::process::id(),
                host: host_name(),
                icrc_omission: cfg.icrc_omission,
            }],
            ranks_share_cores: false,
        };
        return finish_comm(rig, &me, Control::alone(), cfg);
    }
    if job.rank == 0 {
        root(job, cfg)
    } else {
        member(job, cfg)
    }
}

fn join_of(job: &Job, cfg: &NetConfig, ip: IpAddr) -> Join {
    Join {
        rank: job.rank,
        world: job.world,
        settings: SharedSettings::from(&cfg.comm),
        ip,
        pid: std::process::id(),
        host: host_name(),
        shares_cores: cfg.comm.ranks_share_cores,
    }
}

fn member(job: &Job, cfg: &NetConfig) -> Result<NetComm, CollNetError> {
    let deadline = Instant::now() + cfg.bootstrap_timeout;
    let mut stream = loop {
        match TcpStream::connect_timeout(&job.root, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(boot_err(format!(
                    "rank {}: cannot reach the root (rank 0) at {} within {:?}: {e}",
                    job.rank, job.root, cfg.bootstrap_timeout
                )));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let _ = stream.set_nodelay(true);
    let ip = match job.bind_ip {
        Some(ip) => ip,
        None => stream
            .local_addr()
            .map_err(|e| boot_err(format!("local address of the root connection: {e}")))?
            .ip(),
    };
    let rig = rig::rig(job.rank, job.world, cfg, ip)?;
    let hello = Hello {
        test: HELLO_TEST.into(),
        params: join_of(job, cfg, ip),
        endpoint: local_endpoint(&rig, cfg),
        last: false,
    };
    let cm_err = |e: cm::CmError| match e {
        cm::CmError::Refused(why) => boot_err(format!("the root gave up: {why}")),
        other => boot_err(format!("rank {}: {other}", job.rank)),
    };
    cm::send(&mut stream, MsgType::Hello, &hello).map_err(cm_err)?;
    // The root may wait the whole timeout for the last rank.
    stream
        .set_read_timeout(Some(cfg.bootstrap_timeout * 2 + Duration::from_secs(5)))
        .map_err(|e| boot_err(e.to_string()))?;
    let roster: Roster = cm::recv(&mut stream, MsgType::Accept).map_err(cm_err)?;
    if roster.entries.len() != job.world as usize {
        return Err(boot_err(format!(
            "the root's roster has {} ranks, expected {}",
            roster.entries.len(),
            job.world
        )));
    }
    connect_peers(&rig, &roster, cfg)?;
    cm::send(&mut stream, MsgType::Done, &Stage::new("ready")).map_err(cm_err)?;
    let go: Stage = cm::recv(&mut stream, MsgType::Report).map_err(cm_err)?;
    if go.stage != "go" {
        return Err(boot_err(format!(
            "the root said {:?}, expected go",
            go.stage
        )));
    }
    let control = Control::member(job.rank, stream).map_err(|e| boot_err(e.to_string()))?;
    finish_comm(rig, &roster, control, cfg)
}

/// Tells every connected rank why the bootstrap failed.
fn refuse_all(streams: &mut [Option<TcpStream>], why: &str) {
    for s in streams.iter_mut().flatten() {
        let _ = cm::send(s, MsgType::Error, &why.to_owned());
    }
}

type Joined = (TcpStream, Join, Endpoint);

fn root(job: &Job, cfg: &NetConfig) -> Result<NetComm, CollNetError> {
    let world = job.world;
    let deadline = Instant::now() + cfg.bootstrap_timeout;
    let listener = TcpListener::bind(job.root)
        .map_err(|e| boot_err(format!("rank 0 cannot listen on {}: {e}", job.root)))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| boot_err(e.to_string()))?;
    let ip = job.bind_ip.unwrap_or(job.root.ip());
    let rig = rig::rig(0, world, cfg, ip)?;
    let mine = join_of(job, cfg, ip);
    let my_ep = local_endpoint(&rig, cfg);
    let mut joined: Vec<Option<Joined>> = (0..world).map(|_| None).collect();
    let mut count = 1;
    let fail = |joined: &mut Vec<Option<Joined>>, e: CollNetError| -> CollNetError {
        let mut streams: Vec<Option<TcpStream>> =
            joined.iter_mut().map(|j| j.take().map(|j| j.0)).collect();
        refuse_all(&mut streams, &e.to_string());
        e
    };
    while count < world {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let missing: Vec<Rank> = (1..world)
                .filter(|&r| joined[r as usize].is_none())
                .collect();
            let e = CollNetError::MissingRanks {
                missing,
                world,
                timeout: cfg.bootstrap_timeout,
            };
            return Err(fail(&mut joined, e));
        }
        let mut s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10).min(left));
                continue;
            }
            Err(e) => return Err(fail(&mut joined, boot_err(format!("accept: {e}")))),
        };
        let _ = s.set_nonblocking(false);
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(left.max(Duration::from_secs(1))));
        let hello: Hello<Join> = match cm::recv(&mut s, MsgType::Hello) {
            Ok(h) => h,
            // Something that is not a rank (a port scan, a stale client):
            // not fatal, the rank it may have been can still come.
            Err(_) => continue,
        };
        let j = &hello.params;
        let why = if hello.test != HELLO_TEST {
            Some(format!("not a collective bootstrap ({:?})", hello.test))
        } else if j.world != world {
            Some(format!(
                "rank {} says the world has {} ranks, rank 0 says {world}",
                j.rank, j.world
            ))
        } else if j.rank == 0 || j.rank >= world {
            Some(format!("rank {} is not in 1..{world}", j.rank))
        } else if joined[j.rank as usize].is_some() {
            Some(format!("rank {} joined twice", j.rank))
        } else if j.settings != mine.settings {
            Some(format!(
                "rank {}'s communicator settings {:?} differ from rank 0's {:?}",
                j.rank, j.settings, mine.settings
            ))
        } else if hello.endpoint.qpns.len() != world as usize {
            Some(format!(
                "rank {} sent {} QP numbers",
                j.rank,
                hello.endpoint.qpns.len()
            ))
        } else {
            None
        };
        if let Some(why) = why {
            let _ = cm::send(&mut s, MsgType::Error, &why);
            return Err(fail(&mut joined, boot_err(why)));
        }
        let r = j.rank as usize;
        joined[r] = Some((s, hello.params, hello.endpoint));
        count += 1;
    }
    // Everyone is here: hand each rank its peers.
    let entry = |q: Rank, toward: Rank, joined: &[Option<Joined>]| -> PeerEntry {
        if q == 0 {
            entry_of(0, &mine, &my_ep, toward)
        } else {
            let (_, j, ep) = joined[q as usize].as_ref().expect("every rank joined");
            entry_of(q, j, ep, toward)
        }
    };
    let shared = mine.shares_cores || joined.iter().flatten().any(|(_, j, _)| j.shares_cores);
    let rosters: Vec<Roster> = (0..world)
        .map(|r| Roster {
            entries: (0..world).map(|q| entry(q, r, &joined)).collect(),
            ranks_share_cores: shared,
        })
        .collect();
    for r in 1..world as usize {
        let (s, _, _) = joined[r].as_mut().expect("every rank joined");
        if let Err(e) = cm::send(s, MsgType::Accept, &rosters[r]) {
            let e = boot_err(format!("rank {r}: {e}"));
            return Err(fail(&mut joined, e));
        }
    }
    if let Err(e) = connect_peers(&rig, &rosters[0], cfg) {
        return Err(fail(&mut joined, e));
    }
    for r in 1..world as usize {
        let (s, _, _) = joined[r].as_mut().expect("every rank joined");
        let _ = s.set_read_timeout(Some(cfg.bootstrap_timeout.max(Duration::from_secs(1))));
        match cm::recv::<Stage>(s, MsgType::Done) {
            Ok(st) if st.stage == "ready" => {}
            Ok(st) => {
                let e = boot_err(format!("rank {r} said {:?}, expected ready", st.stage));
                return Err(fail(&mut joined, e));
            }
            Err(e) => {
                let e = boot_err(format!("rank {r} did not get ready: {e}"));
                return Err(fail(&mut joined, e));
            }
        }
    }
    let mut streams: Vec<Option<TcpStream>> = joined.into_iter().map(|j| j.map(|j| j.0)).collect();
    for (r, s) in streams.iter_mut().enumerate() {
        if let Some(s) = s
            && let Err(e) = cm::send(s, MsgType::Report, &Stage::new("go"))
        {
            let e = boot_err(format!("rank {r}: {e}"));
            refuse_all(&mut streams, &e.to_string());
            return Err(e);
        }
    }
    let control = Control::root(streams).map_err(|e| boot_err(e.to_string()))?;
    finish_comm(rig, &rosters[0], control, cfg)
}
