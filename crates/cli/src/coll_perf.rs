//! `metaroce coll-perf COLLECTIVE [nccl-tests options] [metaroce options]`:
//! nccl-tests over MetaRoCE, the same options, header, columns, bus
//! bandwidth factors and footer, so its parsers read the output.
//!
//! Where the ranks come from:
//! - `--ranks N` (and no `RANK` in the environment): this command spawns
//!   itself N times on 127.0.0.1, each child one rank (`MASTER_ADDR`,
//!   `MASTER_PORT`, `RANK`, `WORLD_SIZE` set), and exits with the worst
//!   child's status; only rank 0 prints the table;
//! - `RANK`, `WORLD_SIZE`, `MASTER_ADDR` (and `MASTER_PORT`, default
//!   29500) in the environment: one rank of a job across processes,
//!   namespaces or hosts, as torch.distributed runs them;
//! - `--hostfile FILE --rank R`: one rank of the job the file lists;
//! - none of these: a job of one rank.

use metaroce_coll::report::{
    self, DeviceLine, OptionsError, PerfCollective, PerfOptions, ResultRow, RunHeader, USAGE,
};
use metaroce_coll::{Algorithm, CommConfig, DataType};
use metaroce_collnet::{Impair, Job, NetComm, NetConfig, connect, perf};
use std::io::Write as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

/// Arguments of `metaroce coll-perf`: the collective and everything after
/// it, parsed here (nccl-tests' short options do not fit clap's).
#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
pub(crate) struct CollPerfArgs {
    /// all_reduce, all_gather, reduce_scatter, alltoall, broadcast, reduce
    /// or sendrecv (nccl-tests' all_reduce_perf names too); `-h` for the
    /// options.
    collective: String,
    /// nccl-tests options (-b -e -f -i -n -w -m -c -o -d -r -z -a) and
    /// --ranks N, --hostfile F, --rank R, --impair SPEC, --json FILE,
    /// --mtu N, --paths N, --slots N, --slot-bytes N, --bootstrap-timeout S,
    /// --poll-us N, --poll spin|yield, --sleep socket|event, --dev-port P, --stats, --pcap FILE, --pcap-snaplen N,
    /// --offload on|off,
    /// --algo NAME.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    rest: Vec<String>,
}

const METAROCE_USAGE: &str = "\
  --ranks <n>                 spawn n ranks as processes on 127.0.0.1
  --hostfile <file> --rank <r>  one rank of the job the file lists (one host[:port] per line, rank order)
                              (or MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE in the environment)
  --impair <spec>             receive-side impairment of every rank, e.g. loss=0.01
  --json <file>               also write the results as JSON
  --mtu <bytes>               MTU payload bytes (default: sized toward each peer from the path, the largest
                              whose packets leave unfragmented, at most 8192, or 61440 toward a rank on this host; more than the path carries is an error)
  --icrc                      compute and check the ICRC on every data packet (default: ranks agree to leave it
                              to the UDP checksum)
  --offload on|off            UDP GSO and GRO (default on, but off for ranks on a loopback address, as --ranks
                              starts them, when this host has a core per rank)
  --paths <n>                 paths per connection (default 8, or 1 for ranks started by --ranks, all on
                              127.0.0.1)
  --slots <n>                 staging slots per peer (default 4)
  --slot-bytes <size>         bytes per staging slot (default 256K)
  --algo <name>               all-reduce algorithm, like NCCL_ALGO: auto (default: rd up to 64 KiB, then ring,
                              or hd for 4, 8, 16... ranks when a host has more ranks than cores),
                              ring, rd (recursive doubling), hd (recursive halving-doubling) or tree;
                              broadcast: auto, ring (the pipelined chain) or tree
  --bootstrap-timeout <s>     seconds to wait for every rank (default 30)
  --poll-us <us>              poll this long before sleeping; 0: sleep at once (default 1000)
  --poll spin|yield           spin between polls, or give the CPU up (sched_yield) between them (default: spin
                              when this host has a core per rank (LOCAL_WORLD_SIZE, or --ranks), else yield)
  --sleep socket|event        after polling, sleep on the device's receive socket in the rank's thread, or on
                              the CQ's completion event while the device's engine drives (default: socket when
                              ranks share cores, as for --poll, else event)
  --bind core|none            bind each rank of this host to a core: a core of its own when there are no more
                              ranks than cores, as mpirun does, else rank i to the (i mod cores)-th (default core)
  --dev-port <port>           MetaRoCE device UDP port (default 4793, or a free range when another rank has it;
                              a port given here is used as given: one rank per host)
  --stats                     print every rank's device, connection and path counters (name value lines) on
                              stderr at the end, failed or not (also METAROCE_STATS=1)
  --pcap <file>               record every datagram each rank's device sends and receives (pcap, nanosecond
                              timestamps; open with tools/wireshark/metaroce.lua); rank R of a job of several
                              writes <file> with .rankR before its extension (a.pcap: a.rank0.pcap, ...)
  --pcap-snaplen <bytes>      bytes kept of each captured frame (default 262144: whole frames)
";

/// metaroce's own options of the run.
#[derive(Debug, Default)]
struct Extra {
    ranks: Option<u32>,
    hostfile: Option<PathBuf>,
    rank: Option<u32>,
    impair: Option<Impair>,
    json: Option<PathBuf>,
    mtu: Option<u32>,
    paths: Option<u32>,
    slots: Option<u32>,
    slot_bytes: Option<u64>,
    bootstrap_timeout_s: Option<u64>,
    poll_us: Option<u64>,
    poll_mode: Option<String>,
    sleep: Option<String>,
    bind: Option<String>,
    dev_port: Option<u16>,
    stats: bool,
    icrc: bool,
    offload: Option<bool>,
    pcap: Option<PathBuf>,
    pcap_snaplen: Option<u32>,
    algo: Option<Algorithm>,
}

fn split_args(rest: &[String]) -> Result<(Vec<String>, Extra), String> {
    let mut nccl = Vec::new();
    let mut x = Extra::default();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (a.as_str(), None),
        };
        let known = [
            "--ranks",
            "--hostfile",
            "--rank",
            "--impair",
            "--json",
            "--mtu",
            "--paths",
            "--slots",
            "--slot-bytes",
            "--bootstrap-timeout",
            "--poll-us",
            "--poll",
            "--sleep",
            "--bind",
            "--dev-port",
            "--pcap",
            "--pcap-snaplen",
            "--algo",
            "--offload",
        ];
        if name == "--stats" && inline.is_none() {
            x.stats = true;
            continue;
        }
        if name == "--icrc" && inline.is_none() {
            x.icrc = true;
            continue;
        }
        if !known.contains(&name) {
            nccl.push(a.clone());
            continue;
        }
        let v = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))?,
        };
        let num = |what: &str| -> Result<u64, String> {
            report::options::parse_size(&v)
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{what} {v:?} is not a positive number"))
        };
        let small = |what: &str| -> Result<u32, String> {
            u32::try_from(num(what)?).map_err(|_| format!("{what} {v} is too large"))
        };
        match name {
            "--ranks" => x.ranks = Some(small("--ranks")?),
            "--hostfile" => x.hostfile = Some(PathBuf::from(&v)),
            "--rank" => {
                x.rank = Some(
                    v.parse()
                        .map_err(|_| format!("--rank {v:?} is not a rank number"))?,
                )
            }
            "--impair" => x.impair = Some(v.parse::<Impair>()?),
            "--json" => x.json = Some(PathBuf::from(&v)),
            "--mtu" => x.mtu = Some(small("--mtu")?),
            "--paths" => x.paths = Some(small("--paths")?),
            "--slots" => x.slots = Some(small("--slots")?),
            "--slot-bytes" => x.slot_bytes = Some(num("--slot-bytes")?),
            "--poll-us" => {
                x.poll_us = Some(
                    v.parse()
                        .map_err(|_| format!("--poll-us {v:?} is not a number of microseconds"))?,
                )
            }
            "--poll" => {
                if v != "spin" && v != "yield" {
                    return Err(format!("--poll {v:?}: spin or yield"));
                }
                x.poll_mode = Some(v.clone());
            }
            "--sleep" => {
                if v != "socket" && v != "event" {
                    return Err(format!("--sleep {v:?}: socket or event"));
                }
                x.sleep = Some(v.clone());
            }
            "--offload" => {
                x.offload = match v.as_str() {
                    "on" => Some(true),
                    "off" => Some(false),
                    _ => return Err(format!("--offload {v:?}: on or off")),
                }
            }
            "--bind" => {
                if v != "core" && v != "none" {
                    return Err(format!("--bind {v:?}: core or none"));
                }
                x.bind = Some(v.clone());
            }
            "--dev-port" => {
                x.dev_port = Some(
                    v.parse()
                        .map_err(|_| format!("--dev-port {v:?} is not a UDP port (0..=65535)"))?,
                )
            }
            "--pcap" => x.pcap = Some(PathBuf::from(&v)),
            "--pcap-snaplen" => x.pcap_snaplen = Some(small("--pcap-snaplen")?),
            "--algo" => x.algo = Some(v.parse::<Algorithm>().map_err(|e| format!("--algo: {e}"))?),
            _ => x.bootstrap_timeout_s = Some(num("--bootstrap-timeout")?),
        }
    }
    if x.ranks.is_some_and(|n| n > 1024) {
        return Err("--ranks must be 1..=1024".into());
    }
    if x.pcap_snaplen.is_some() && x.pcap.is_none() {
        return Err("--pcap-snaplen needs --pcap FILE".into());
    }
    if x.mtu.is_some_and(|m| !(256..=65_000).contains(&m)) {
        return Err("--mtu must be 256..=65000".into());
    }
    if x.paths.is_some_and(|p| !(1..=128).contains(&p)) {
        return Err("--paths must be 1..=128".into());
    }
    if x.hostfile.is_some() != x.rank.is_some() {
        return Err("--hostfile and --rank go together".into());
    }
    Ok((nccl, x))
}

/// How a waiting rank polls by default: for up to 1 ms before it sleeps,
/// as MPI and NCCL poll; spinning where every rank on this host has a
/// core, and yielding the CPU between polls (`sched_yield`, as Open MPI
/// does when oversubscribed) where ranks share cores (a spinning rank
/// takes the CPU the rank it waits for needs: on 2 cores, 4 spinning ranks
/// took 2 ms per 8-byte all-reduce, yielding ones 0.25 ms, sleeping ones
/// 0.45 ms). Ranks per host: torchrun's `LOCAL_WORLD_SIZE` (which
/// `--ranks` sets for the ranks it spawns), else one. Returns the window
/// in µs and whether to yield.
///
/// The window is the same 1 ms when ranks share cores. A 50 µs window
/// there saved a tenth of the CPU time of a 4 MiB all-reduce at 8 ranks on
/// 2 cores, but every sleep it adds costs a wake-up: in five interleaved
/// rounds on 2 cores, 1 ms against 50 µs gave 8-byte all-reduces of 182 /
/// 190 µs (4 ranks) and 516 / 561 µs (8 ranks), and 1 MiB busbw of 0.34 /
/// 0.24 GB/s (4 ranks).
fn poll_defaults() -> (u64, bool) {
    let local = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1);
    (POLL_US, shares_cores(local))
}

/// This rank's place among the ranks of its host: `LOCAL_RANK` and
/// `LOCAL_WORLD_SIZE` (torchrun's names; `--ranks` sets the second), or the
/// job's rank when the whole job is on this host.
fn local_rank(job: &Job) -> Option<(u32, u32)> {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    let local_world = var("LOCAL_WORLD_SIZE")?;
    match var("LOCAL_RANK") {
        Some(r) => Some((r, local_world)),
        None => (local_world == job.world).then_some((job.rank, local_world)),
    }
}

/// Binds the calling thread, and so every thread it starts afterwards (the
/// device's engine, the control channel), to a CPU this process may run
/// on: the `local_rank`-th, round robin when there are more ranks than
/// such CPUs. Returns the CPU, or `None` when the system refused.
///
/// A waiting rank with a core of its own spins for its peer's message.
/// Left to float, two such ranks on a 2-vCPU host that also runs something
/// else (a build, another job) were often put on the same core, and each
/// then spun through its time slice while the peer it waited for sat
/// runnable behind it: 1 MiB all-reduce over 2 ranks ran at 0.3-3 GB/s
/// from run to run and an 8-byte one took 6 µs or 1 ms, where the same
/// ranks bound to cores 0 and 1 ran at 1.1-3.5 GB/s and 6-27 µs
/// (BENCHMARKS.md, collectives round 12).
///
/// Ranks that share cores are bound too (rank `i` to CPU `i mod n`). A
/// waiting rank yields between polls, and a floating one still counts as
/// runnable where it is: the scheduler balanced the ranks' count per CPU,
/// not the work, and often left the two ranks with work on one CPU while
/// the other ran the two waiting ones. 1 MiB all-reduce over 4 ranks on 2
/// vCPUs, after the settling pause ([`SETTLE`]): about 1.6 GB/s bus
/// bandwidth bound against 0.4-1.4 floating; 8 ranks 0.60-0.69 against
/// 0.22-0.61 (BENCHMARKS.md, collectives round 14).
#[allow(unsafe_code)]
fn bind_to_core(local_rank: u32, local_world: u32) -> Option<usize> {
    if local_rank >= local_world {
        return None;
    }
    let size = size_of::<libc::cpu_set_t>();
    // SAFETY: `cpu_set_t` is a plain bit array, for which all zeroes is a
    // valid (empty) value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable `cpu_set_t` of `size` bytes; pid 0
    // names the calling thread.
    if unsafe { libc::sched_getaffinity(0, size, &raw mut set) } != 0 {
        return None;
    }
    let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, the bit count of `set`.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect();
    if allowed.is_empty() {
        return None;
    }
    // More ranks than CPUs: round robin.
    let cpu = allowed[local_rank as usize % allowed.len()];
    // SAFETY: as above, an empty set.
    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` came from the scan above, so it is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    // SAFETY: `one` is a valid `cpu_set_t` of `size` bytes; pid 0 names the
    // calling thread.
    (unsafe { libc::sched_setaffinity(0, size, &raw const one) } == 0).then_some(cpu)
}

/// How long a waiting rank polls before it sleeps, µs.
const POLL_US: u64 = 1000;

/// Whether ranks share cores: more ranks on this host than CPUs.
fn shares_cores(local_world: u32) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    local_world as usize > cores
}

/// How long ranks that share cores pause between the bootstrap and the
/// first measurement. For the first 100-200 ms after the bootstrap they
/// ran at a third of their later speed (1 MiB all-reduce over 4 ranks on 2
/// vCPUs, bound: 0.3-0.6 GB/s bus bandwidth in whichever measurement came
/// first, out of place or in place, 1.5-1.7 GB/s in the second; with this
/// pause 1.5-1.7 in both), whatever the warm-up iterations (`-w 50` did not
/// help). The same pause before the bootstrap does not help: it is the new
/// connections' first moments (more retransmission timeouts, longer RTT
/// estimates), not understood further yet (docs/collectives.md, "Where the
/// time goes"). `mpirun`'s ranks spend longer than this in `MPI_Init`
/// before their first measurement. nccl-tests reports steady state, which
/// the pause lets coll-perf measure.
const SETTLE: Duration = Duration::from_millis(200);

pub(crate) fn run(args: CollPerfArgs) -> Result<ExitCode, String> {
    if matches!(args.collective.as_str(), "-h" | "--help") {
        print!("usage: metaroce coll-perf COLLECTIVE [options]\n{USAGE}{METAROCE_USAGE}");
        return Ok(ExitCode::SUCCESS);
    }
    let collective: PerfCollective = args.collective.parse().map_err(|e| format!("{e}"))?;
    let (nccl_args, extra) = split_args(&args.rest)?;
    let options = match report::parse_perf_args(&nccl_args) {
        Ok(o) => o,
        Err(OptionsError::Help) => {
            print!(
                "usage: metaroce coll-perf {} [options]\n{USAGE}{METAROCE_USAGE}",
                collective.name()
            );
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e.to_string()),
    };
    let mut comm_cfg = CommConfig {
        // Where ranks share cores, every step waits for the scheduler:
        // Auto all-reduce takes halving-doubling's fewer steps (the
        // bootstrap makes it job-wide if any host is oversubscribed).
        ranks_share_cores: poll_defaults().1,
        ..CommConfig::default()
    };
    if let Some(s) = extra.slots {
        comm_cfg.slots = s;
    }
    if let Some(b) = extra.slot_bytes {
        comm_cfg.slot_bytes = b;
    }
    comm_cfg.validate().map_err(|e| e.to_string())?;
    if let Some(algo) = extra.algo {
        // Checked before any rank starts: an algorithm the collective does
        // not implement would only fail at its first operation.
        let spec = perf::spec_for(
            collective,
            1,
            DataType::Float32,
            metaroce_coll::ReduceOp::Sum,
            0,
            0,
            2,
        );
        algo.resolve(&spec.collective, 0, 2, &comm_cfg)
            .map_err(|e| format!("--algo {algo}: {e}"))?;
    }
    let in_env = std::env::var_os("RANK").is_some();
    if let (Some(n), false, None) = (extra.ranks, in_env, &extra.hostfile) {
        return launch(n);
    }
    let job = if let (Some(file), Some(rank)) = (&extra.hostfile, extra.rank) {
        Job::from_hostfile(file, rank).map_err(|e| e.to_string())?
    } else if in_env {
        Job::from_env().map_err(|e| e.to_string())?
    } else {
        Job {
            rank: 0,
            world: 1,
            root: "127.0.0.1:0".parse().expect("an address"),
            bind_ip: None,
        }
    };
    if let Some(n) = extra.ranks
        && n != job.world
    {
        return Err(format!("--ranks {n} but the job has {} ranks", job.world));
    }
    let seed = metaroce_udp::os_seed();
    let mut cfg = NetConfig {
        comm: comm_cfg,
        seed: seed ^ u64::from(job.rank),
        impair: extra.impair.map(|i| Impair {
            seed: i.seed.wrapping_add(u64::from(job.rank)),
            ..i
        }),
        ..NetConfig::default()
    };
    if let Some(m) = extra.mtu {
        cfg.mtu = m;
    }
    if let Some(p) = extra.paths {
        cfg.paths = p;
    }
    cfg.icrc_omission = !extra.icrc;
    cfg.offload = extra.offload;
    let (poll_us, yield_polling) = poll_defaults();
    cfg.poll_before_sleep = Duration::from_micros(extra.poll_us.unwrap_or(poll_us));
    cfg.yield_while_polling = match extra.poll_mode.as_deref() {
        Some("yield") => true,
        Some(_) => false,
        None => yield_polling,
    };
    cfg.sleep_on_socket = match extra.sleep.as_deref() {
        Some(s) => s == "socket",
        None => yield_polling,
    };
    if let Some(s) = extra.bootstrap_timeout_s {
        cfg.bootstrap_timeout = Duration::from_secs(s);
    }
    if let Some(port) = extra.dev_port {
        cfg.device_port = port;
        cfg.device_port_fallback = false;
    }
    let pcap = match &extra.pcap {
        Some(path) => {
            let path = rank_capture_path(path, job.rank, job.world);
            let snaplen = extra.pcap_snaplen.unwrap_or(metaroce_udp::DEFAULT_SNAPLEN);
            let pcap = metaroce_udp::PcapCapture::create(&path, snaplen)
                .map_err(|e| format!("--pcap {}: {e}", path.display()))?;
            let pcap = std::sync::Arc::new(pcap);
            cfg.capture = Some(std::sync::Arc::clone(&pcap) as _);
            Some((path, pcap))
        }
        None => None,
    };
    if extra.bind.as_deref() != Some("none")
        && let Some((local_rank, local_world)) = local_rank(&job)
    {
        // Before the device starts: its engine thread inherits the core.
        bind_to_core(local_rank, local_world);
    }
    let mut comm = connect(&job, &cfg).map_err(|e| e.to_string())?;
    if local_rank(&job).is_some_and(|(_, local_world)| shares_cores(local_world)) {
        // Let the job settle before the first measurement (see SETTLE).
        std::thread::sleep(SETTLE);
    }
    let result = run_rank(&mut comm, collective, &options, &extra);
    let stats =
        extra.stats || std::env::var("METAROCE_STATS").is_ok_and(|v| !v.is_empty() && v != "0");
    if stats {
        // One write per rank, so ranks sharing the terminal do not interleave.
        let c = comm.device_counters();
        let mut lines = c.lines();
        lines.extend(
            comm.driver_stats()
                .fields()
                .into_iter()
                .map(|(n, v)| (format!("coll.{n}"), v)),
        );
        stderr_in_one_write(&format!(
            "# counters of rank {} device {}\n{}",
            comm.rank(),
            c.addr,
            metaroce_udp::format_counter_lines(&lines)
        ));
    }
    let finished = comm.finish().map_err(|e| e.to_string());
    if let Some((path, pcap)) = pcap {
        // `finish` closed the device: every datagram it saw is in the file.
        let n = pcap
            .finish()
            .map_err(|e| format!("--pcap {}: {e}", path.display()))?;
        stderr_in_one_write(&format!(
            "pcap: rank {} wrote {n} packets to {}\n",
            job.rank,
            path.display()
        ));
    }
    let code = result?;
    finished?;
    Ok(code)
}

/// Where rank `rank` of a job of `world` ranks writes `--pcap path`: the
/// path itself for one rank, else with `.rank<R>` before its extension,
/// so ranks sharing a directory do not overwrite each other.
fn rank_capture_path(path: &std::path::Path, rank: u32, world: u32) -> PathBuf {
    if world <= 1 {
        return path.to_path_buf();
    }
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}

/// Spawns `n` ranks of this very command on 127.0.0.1.
fn launch(n: u32) -> Result<ExitCode, String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port on 127.0.0.1: {e}"))?
        .port();
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut kids = Vec::new();
    for rank in 0..n {
        let kid = Command::new(&exe)
            .args(&argv)
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .stdout(if rank == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .map_err(|e| format!("cannot start rank {rank}: {e}"))?;
        kids.push(kid);
    }
    let mut worst = 0;
    for (rank, mut kid) in kids.into_iter().enumerate() {
        let status = kid
            .wait()
            .map_err(|e| format!("waiting for rank {rank}: {e}"))?;
        let code = status.code().unwrap_or(3);
        if code != 0 && worst == 0 {
            eprintln!("metaroce: rank {rank} exited with {status}");
        }
        worst = worst.max(code);
    }
    Ok(ExitCode::from(worst.clamp(0, 255) as u8))
}

fn device_lines(comm: &NetComm) -> Vec<DeviceLine> {
    comm.members()
        .iter()
        .map(|m| DeviceLine {
            rank: m.rank,
            group: 0,
            pid: m.pid,
            hostname: m.host.clone(),
            device: 0,
            pci: (0, 0, 0),
            name: format!("MetaRoCE UDP {}", m.device),
        })
        .collect()
}

fn run_rank(
    comm: &mut NetComm,
    collective: PerfCollective,
    options: &PerfOptions,
    extra: &Extra,
) -> Result<ExitCode, String> {
    let lead = comm.rank() == 0;
    let program = collective.program_name();
    if lead {
        let header = RunHeader {
            program: program.clone(),
            writer: format!("metaroce coll-perf {}", env!("CARGO_PKG_VERSION")),
            min_bytes: options.min_bytes,
            max_bytes: options.max_bytes,
            step_factor: options.step_factor,
            step_bytes: options.step_bytes,
            warmup_iters: options.warmup_iters,
            iters: options.iters,
            agg_iters: options.agg_iters,
            validation: options.check,
            blocking: options.blocking,
            devices: device_lines(comm),
        };
        print!("{}", report::format_header(&header));
        print!("{}", report::format_table_header());
        let _ = std::io::stdout().flush();
    }
    let mut on_row = |row: &ResultRow| {
        if lead {
            print!("{}", report::format_row(row));
            let _ = std::io::stdout().flush();
        }
    };
    let algorithm = extra.algo.unwrap_or(Algorithm::Auto);
    let rows = perf::run(
        comm,
        collective,
        algorithm,
        options,
        0x6e63_636c,
        &mut on_row,
    )
    .map_err(|e| e.to_string())?;
    let bad = report::out_of_bounds(&rows);
    let avg = report::average_bus_bw(&rows);
    if lead {
        let min_bw = std::env::var("NCCL_TESTS_MIN_BW")
            .ok()
            .and_then(|v| v.parse::<f64>().ok());
        print!(
            "{}",
            report::format_footer(bad, avg, min_bw, &program, None)
        );
        if let Some(path) = &extra.json {
            write_json(path, collective, comm.world(), options, &rows, bad, avg)?;
        }
    }
    Ok(if bad > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn measurement_json(m: &report::Measurement) -> serde_json::Value {
    serde_json::json!({
        "time_us": m.time_us,
        "algbw_gbps": m.alg_bw,
        "busbw_gbps": m.bus_bw,
        "wrong": m.wrong,
    })
}

fn write_json(
    path: &PathBuf,
    collective: PerfCollective,
    world: u32,
    o: &PerfOptions,
    rows: &[ResultRow],
    out_of_bounds: u64,
    avg: f64,
) -> Result<(), String> {
    let doc = serde_json::json!({
        "program": collective.program_name(),
        "collective": collective.name(),
        "world": world,
        "options": {
            "minbytes": o.min_bytes, "maxbytes": o.max_bytes, "stepbytes": o.step_bytes,
            "stepfactor": o.step_factor, "iters": o.iters, "warmup_iters": o.warmup_iters,
            "agg_iters": o.agg_iters, "check": o.check, "blocking": o.blocking, "average": o.average, "register": o.register,
            "op": o.op.map(|x| x.nccl_name()), "datatype": o.dtype.map(DataType::nccl_name),
            "root": o.root,
        },
        "results": rows.iter().map(|r| serde_json::json!({
            "size": r.size_bytes, "count": r.count, "type": r.type_name, "redop": r.redop,
            "root": r.root, "out_of_place": measurement_json(&r.out_of_place),
            "in_place": measurement_json(&r.in_place),
        })).collect::<Vec<_>>(),
        "out_of_bounds": out_of_bounds,
        "avg_bus_bandwidth": if avg.is_finite() { Some(avg) } else { None },
    });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n")
        .map_err(|e| format!("cannot write --json {}: {e}", path.display()))
}

/// Ranks of one job share the launcher's stderr. `eprint!` hands the pipe
/// each formatted piece as its own write, so two ranks' lines could
/// interleave mid-line; one `write_all` of the finished text is one write
/// (atomic on a pipe up to `PIPE_BUF`, 4 KiB on Linux).
fn stderr_in_one_write(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}
