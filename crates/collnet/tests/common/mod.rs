//! Ranks as threads of one process, each with its own device on 127.0.0.1
//! and its own bootstrap connection to the root, exactly as separate
//! processes would have.

#![allow(dead_code)]

use metaroce_coll::Rank;
use metaroce_collnet::{CollNetError, Job, NetComm, NetConfig, connect};
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;

/// A free port on 127.0.0.1 for a root to listen on, found by binding a
/// UDP socket. (A TCP listener bound and closed to find it was copied into
/// a child that another test forked at that moment: until the child's
/// `exec` the root's own bind failed and a rank's connection landed in the
/// copy's backlog, then was reset. A CI run saw "Connection reset by
/// peer".)
pub(crate) fn free_root() -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap()
}

/// A job of `world` ranks around `root`.
pub(crate) fn job(rank: Rank, world: u32, root: SocketAddr) -> Job {
    Job {
        rank,
        world,
        root,
        bind_ip: None,
    }
}

/// Runs `body` on every rank of a fresh `world`-rank job and returns each
/// rank's result, rank 0 first.
pub(crate) fn run_ranks<R: Send + 'static>(
    world: u32,
    cfg: &NetConfig,
    body: impl Fn(&mut NetComm) -> Result<R, CollNetError> + Send + Sync + 'static,
) -> Vec<Result<R, CollNetError>> {
    let root = free_root();
    let body = Arc::new(body);
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let cfg = NetConfig {
                seed: 1000 + u64::from(rank),
                ..cfg.clone()
            };
            let body = Arc::clone(&body);
            std::thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn(move || -> Result<R, CollNetError> {
                    let mut comm = connect(&job(rank, world, root), &cfg)?;
                    let r = body(&mut comm)?;
                    comm.finish()?;
                    Ok(r)
                })
                .unwrap()
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Test settings: short timeouts so a failure shows quickly.
pub(crate) fn cfg() -> NetConfig {
    NetConfig {
        bootstrap_timeout: std::time::Duration::from_secs(20),
        stall_timeout: std::time::Duration::from_secs(30),
        ..NetConfig::default()
    }
}
