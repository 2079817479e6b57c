//! Who is in the job and where its root is: torch.distributed's
//! environment (`MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`) or a
//! host file.
//!
//! Rank 0 is the root: it listens on the root address, collects every
//! rank's description and hands each rank what it needs about its peers
//! (see [`crate::bootstrap`]). A host file lists one rank per line in
//! rank order, `HOST` or `HOST:PORT`; the first line is the root (its port,
//! if given, is the bootstrap port, else [`DEFAULT_PORT`]); every rank binds
//! its MetaRoCE device on the address of its own line. Blank lines and
//! `#` comments are ignored.

use crate::CollNetError;
use metaroce_coll::Rank;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;

/// The bootstrap port when none is given (torch.distributed's customary one).
pub const DEFAULT_PORT: u16 = 29500;

/// One rank's view of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// This rank.
    pub rank: Rank,
    /// Ranks in the job.
    pub world: u32,
    /// Where rank 0 listens.
    pub root: SocketAddr,
    /// The address this rank's device binds; `None`: the address the
    /// kernel picks to reach the root (the root itself: the root's IP).
    pub bind_ip: Option<IpAddr>,
}

fn job_err(what: impl Into<String>) -> CollNetError {
    CollNetError::Job(what.into())
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, CollNetError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .map_err(|e| job_err(format!("cannot resolve {host:?}: {e}")))?
        .find(SocketAddr::is_ipv4)
        .or_else(|| (host, port).to_socket_addrs().ok()?.next())
        .ok_or_else(|| job_err(format!("{host:?} has no address")))
}

impl Job {
    /// A job described by values (`MASTER_ADDR`, `MASTER_PORT`, `RANK`,
    /// `WORLD_SIZE`), each checked.
    pub fn from_values(
        master_addr: &str,
        master_port: &str,
        rank: &str,
        world: &str,
    ) -> Result<Self, CollNetError> {
        let port: u16 = master_port
            .trim()
            .parse()
            .map_err(|_| job_err(format!("MASTER_PORT={master_port:?} is not a port")))?;
        let world: u32 = world
            .trim()
            .parse()
            .ok()
            .filter(|&w| (1..=1024).contains(&w))
            .ok_or_else(|| job_err(format!("WORLD_SIZE={world:?} must be 1..=1024")))?;
        let rank: u32 = rank
            .trim()
            .parse()
            .ok()
            .filter(|&r| r < world)
            .ok_or_else(|| job_err(format!("RANK={rank:?} must be 0..{world}")))?;
        let root = resolve(master_addr.trim(), port)?;
        if root.ip().is_unspecified() {
            return Err(job_err(format!(
                "MASTER_ADDR={master_addr:?} must name the root's address, not the unspecified one"
            )));
        }
        Ok(Self {
            rank,
            world,
            root,
            bind_ip: None,
        })
    }

    /// The job from the environment: `MASTER_ADDR`, `MASTER_PORT`
    /// (default [`DEFAULT_PORT`]), `RANK`, `WORLD_SIZE`.
    pub fn from_env() -> Result<Self, CollNetError> {
        let var = |k: &str| std::env::var(k).ok();
        let addr = var("MASTER_ADDR").ok_or_else(|| job_err("MASTER_ADDR is not set"))?;
        let port = var("MASTER_PORT").unwrap_or_else(|| DEFAULT_PORT.to_string());
        let rank = var("RANK").ok_or_else(|| job_err("RANK is not set"))?;
        let world = var("WORLD_SIZE").ok_or_else(|| job_err("WORLD_SIZE is not set"))?;
        Self::from_values(&addr, &port, &rank, &world)
    }

    /// The job from a host file's text (see the module docs) for `rank`.
    pub fn from_hostfile_text(text: &str, rank: Rank) -> Result<Self, CollNetError> {
        let mut hosts = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (host, port) = match line.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') || h.ends_with(']') => {
                    let port = p.parse::<u16>().map_err(|_| {
                        job_err(format!("host file line {}: bad port {p:?}", n + 1))
                    })?;
                    (h, Some(port))
                }
                _ => (line, None),
            };
            let addr = resolve(host, port.unwrap_or(DEFAULT_PORT))
                .map_err(|e| job_err(format!("host file line {}: {e}", n + 1)))?;
            hosts.push((addr, port.is_some()));
        }
        let world = hosts.len() as u32;
        if world == 0 {
            return Err(job_err("the host file lists no host"));
        }
        let Some(&(mine, _)) = hosts.get(rank as usize) else {
            return Err(job_err(format!(
                "rank {rank} is not in the host file's {world} lines"
            )));
        };
        Ok(Self {
            rank,
            world,
            root: hosts[0].0,
            bind_ip: Some(mine.ip()),
        })
    }

    /// The job from a host file for `rank`.
    pub fn from_hostfile(path: &Path, rank: Rank) -> Result<Self, CollNetError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| job_err(format!("cannot read host file {}: {e}", path.display())))?;
        Self::from_hostfile_text(&text, rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_values_are_checked() {
        let j = Job::from_values("127.0.0.1", "29400", "3", "4").unwrap();
        assert_eq!((j.rank, j.world, j.root.port()), (3, 4, 29400));
        assert!(Job::from_values("127.0.0.1", "x", "0", "2").is_err());
        assert!(Job::from_values("127.0.0.1", "1", "2", "2").is_err());
        assert!(Job::from_values("127.0.0.1", "1", "0", "0").is_err());
        assert!(Job::from_values("0.0.0.0", "1", "0", "2").is_err());
        assert!(Job::from_values("no such host.invalid", "1", "0", "2").is_err());
    }

    #[test]
    fn host_file() {
        let text = "# the job\n127.0.0.1:4000\n127.0.0.2\n\n127.0.0.3 # last\n";
        let j = Job::from_hostfile_text(text, 2).unwrap();
        assert_eq!(j.world, 3);
        assert_eq!(j.root, "127.0.0.1:4000".parse().unwrap());
        assert_eq!(j.bind_ip, Some("127.0.0.3".parse().unwrap()));
        let j = Job::from_hostfile_text("127.0.0.1\n", 0).unwrap();
        assert_eq!(j.root.port(), DEFAULT_PORT);
        assert!(Job::from_hostfile_text(text, 3).is_err());
        assert!(Job::from_hostfile_text("\n# nothing\n", 0).is_err());
        assert!(Job::from_hostfile_text("127.0.0.1:x\n", 0).is_err());
    }
}
