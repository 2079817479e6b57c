//! Ranks as threads of one process, each with its own device on 127.0.0.1
//! and its own bootstrap connection to the root, exactly as separate
//! processes would have.

#![allow(dead_code)]

use metaroce_coll::Rank;
use metaroce_collnet::{CollNetError, Job, NetComm, NetConfig, connect};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

/// A port on 127.0.0.1 for a root to listen on, below the kernel's
/// ephemeral range (32768-60999 by default), where no connection's local
/// port can be: a port found by binding a UDP socket was once held by a
/// TCP connection of another test ("Address already in use"), and one
/// found by binding and closing a TCP listener was copied into a child
/// another test forked at that moment ("Connection reset by peer"). Each
/// call in a process takes the next of its 100 ports; the block depends on
/// the process id.
pub(crate) fn free_root() -> SocketAddr {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let block = 20_000 + (std::process::id() % 120) as u16 * 100;
    let port = block + NEXT.fetch_add(1, Ordering::Relaxed) % 100;
    SocketAddr::from(([127, 0, 0, 1], port))
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
    run_ranks_with(world, |_| cfg.clone(), body)
}

/// [`run_ranks`] with each rank's settings from `cfg_of(rank)`.
pub(crate) fn run_ranks_with<R: Send + 'static>(
    world: u32,
    cfg_of: impl Fn(Rank) -> NetConfig,
    body: impl Fn(&mut NetComm) -> Result<R, CollNetError> + Send + Sync + 'static,
) -> Vec<Result<R, CollNetError>> {
    let root = free_root();
    let body = Arc::new(body);
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let cfg = NetConfig {
                seed: 1000 + u64::from(rank),
                ..cfg_of(rank)
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
