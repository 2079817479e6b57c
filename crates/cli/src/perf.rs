//! `metaroce perf`: perftest-style tools over the real UDP datapath.
//!
//! `metaroce perf write-bw` (server) / `metaroce perf write-bw HOST`
//! (client) / `metaroce perf write-bw --loopback` (both in one process).
//! Tests: write-bw, write-lat, read-bw, read-lat, send-bw, send-lat,
//! atomic-bw, atomic-lat, and the raw-UDP baselines udp-bw, udp-lat.
//!
//! perftest's flags are accepted where they mean something here (`-m`,
//! `-Q`, `-l`, `-I`, `-N`, `--run_infinitely`, `--out_json[_file]`, the
//! software rate limiter's `--rate_limit`, `--rate_units`, `--burst_size`),
//! accepted and ignored with a note where they are harmless (`-F`, `-d`,
//! `-x`), and refused with "not supported by MetaRoCE" otherwise; every
//! option is checked before the run starts.

use metaroce_perf::raw::{self, RawParams, RawTest};
use metaroce_perf::{
    self as perf, AuthOpts, BwFigures, Figures, JsonRun, LAT_DURATION_HEADER, LAT_TABLE_HEADER,
    LocalOpts, Measure, Params, RESULT_LINE, RateLimit, RateUnits, Session, Test,
};
use metaroce_udp::{CaptureHook, DeviceCounters, Impair, PcapCapture};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// What "BW peak" means here, and how perftest's flags are treated.
const AFTER_HELP: &str = "\
BW peak[...]: the highest rate the transfer held over any stretch of at \
least 1 ms between completions (perftest takes its peak over one \
CQ-moderation interval, which with bursty completions reads above the \
link). perftest measures no peak with -D, --run_infinitely, -N or beyond \
20000 iterations and prints 0.00; MetaRoCE measures it in every mode but \
-N and --run_infinitely.

perftest flags: -F, -d and -x are accepted and ignored (there is no CPU \
frequency check, no device or GID to choose); -c takes RC only; \
--rate_limit_type takes SW only (the requester paces its own posts: no NIC \
pacing, so no HW or PP); -b, --report-both and -V are not supported.";

/// Arguments of `metaroce perf`.
#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true, after_help = AFTER_HELP)]
pub(crate) struct PerfArgs {
    /// Test: write-bw, write-lat, read-bw, read-lat, send-bw, send-lat,
    /// atomic-bw, atomic-lat, udp-bw, udp-lat.
    test: String,
    /// Server host (client mode); none: server mode.
    host: Option<String>,
    /// Run server and client in this process over 127.0.0.1.
    #[arg(long)]
    loopback: bool,
    /// Message size in bytes, K and M suffixes binary [default: 65536 for
    /// *-bw, 2 for *-lat, 8 for atomics; udp-bw 65536, udp-lat 2].
    #[arg(short = 's', long = "size", value_parser = parse_size)]
    size: Option<u64>,
    /// Iterations, at least 5 [default: 5000 for write-bw, 1000 for the
    /// others].
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// Sweep sizes 2 ..= 2^23 (powers of two).
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Run for this many seconds instead of an iteration count (with
    /// --run_infinitely: report every this many seconds) [default: by
    /// iterations; udp-bw 2].
    #[arg(short = 'D', long = "duration")]
    duration: Option<u64>,
    /// Number of QPs, 1..=64 (bandwidth tests) [default: 1].
    #[arg(short = 'q', long = "qp")]
    qps: Option<u32>,
    /// Outstanding work requests per QP, 1..=2048 (bandwidth tests)
    /// [default: 128; latency tests 1].
    #[arg(short = 't', long = "tx-depth")]
    tx_depth: Option<u32>,
    /// Generate a completion for one work request in this many, 1..=1024
    /// (perftest's CQ moderation; bandwidth tests) [default: 100, or 1
    /// above 8192 B; never more than -t].
    #[arg(short = 'Q', long = "cq-mod")]
    cq_mod: Option<u32>,
    /// Post at most this many work requests per post_send call, 1..=2048
    /// (bandwidth tests; perftest's default is 1) [default: 32].
    #[arg(short = 'l', long = "post_list")]
    post_list: Option<u32>,
    /// Copy WRITE and SEND payloads of at most this many bytes into the
    /// work request at post time, 0..=1024 [default: perftest's, 220 for
    /// write-lat, 236 for send-lat, 0 otherwise].
    #[arg(short = 'I', long = "inline_size")]
    inline_size: Option<u32>,
    /// Do not measure the peak bandwidth (reported as 0.00).
    #[arg(short = 'N', long = "noPeak")]
    no_peak: bool,
    /// Run a bandwidth test until stopped (Ctrl-C), printing the rate of
    /// every -D seconds [default interval: 5 s].
    #[arg(long = "run_infinitely")]
    run_infinitely: bool,
    /// Bytes of buffer per side that successive messages cycle through,
    /// up to 64 MiB, for a run with cold caches (at least one message)
    /// [default: perftest's, one page or one message if larger].
    #[arg(long = "buffer-bytes", value_name = "BYTES")]
    buffer_bytes: Option<u64>,
    /// Report Gb/s instead of MiB/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Send at most this rate, in --rate_units (bandwidth tests; the
    /// requester paces its posts in software) [default: no limit].
    #[arg(long = "rate_limit", value_name = "RATE")]
    rate_limit: Option<f64>,
    /// Units of --rate_limit: M (MiB/s), g (Gb/s) or p (messages per
    /// second, perftest's pps) [default: g].
    #[arg(long = "rate_units", value_name = "M|g|p", value_parser = parse_rate_units)]
    rate_units: Option<RateUnits>,
    /// Rate limiter: SW only, the requester's own pacing (perftest's HW
    /// and PP need a NIC that paces) [default: SW with --rate_limit].
    #[arg(long = "rate_limit_type", value_name = "SW|HW|PP")]
    rate_limit_type: Option<String>,
    /// Messages the rate limiter lets go back to back before it waits,
    /// 1..=(-t x -q) [default: -l; perftest's is -t].
    #[arg(long = "burst_size", value_name = "N")]
    burst_size: Option<u32>,
    /// TCP port of the side channel.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Paths (UDP source ports) per connection, 1..=128.
    #[arg(long, default_value_t = 16)]
    paths: u32,
    /// MTU: payload bytes per packet, 64..=65000 (perftest's -m); a value
    /// the path to the peer cannot carry unfragmented is an error
    /// [default: sized from the path, the largest whose packets leave
    /// unfragmented, at most 8192, or 61440 toward a peer on this host].
    #[arg(short = 'm', long)]
    mtu: Option<u32>,
    /// Write the results as JSON, in perftest's --out_json layout plus the
    /// run's parameters, to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write the JSON report to --out_json_file (perftest's flag).
    #[arg(long = "out_json")]
    out_json: bool,
    /// File of the JSON report; implies --out_json [default:
    /// perftest_out.json].
    #[arg(long = "out_json_file", value_name = "FILE")]
    out_json_file: Option<PathBuf>,
    /// Do not verify transferred data.
    #[arg(long = "no-verify")]
    no_verify: bool,
    /// Receive-side impairment, e.g. loss=0.01,reorder=0.05,dup=0.01,seed=7
    /// [default: none].
    #[arg(long, value_parser = |s: &str| s.parse::<Impair>())]
    impair: Option<Impair>,
    /// Seed of the device (keys, PSNs, ports) and the verification
    /// pattern [default: from the OS; the JSON report records it].
    #[arg(long)]
    seed: Option<u64>,
    /// MetaRoCE device UDP port; the paths' source ports are the ones
    /// above it; 0: a free range [default: 4793, or a free range when
    /// that is taken, as by --loopback's other side].
    #[arg(long = "dev-port")]
    dev_port: Option<u16>,
    /// Print every counter of this side's device, its connection and each
    /// path as `name value` lines (as `ethtool -S` does) after the run, or
    /// when it fails (also with METAROCE_STATS=1). The client prints its
    /// own device's, a server its own after each session.
    #[arg(long)]
    stats: bool,
    /// Record every datagram this side's device sends and receives to FILE
    /// (pcap, Ethernet/IPv4/UDP frames, nanosecond timestamps; open with
    /// tools/wireshark/metaroce.lua). With --loopback the client's device
    /// records, which sees every datagram of the run.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Bytes kept of each captured frame [default: 262144, whole frames].
    #[arg(long = "pcap-snaplen", value_name = "N")]
    pcap_snaplen: Option<u32>,
    /// Turn off UDP GSO and GRO.
    #[arg(long = "no-offload")]
    no_offload: bool,
    /// Copy every received payload from a receive buffer into its memory
    /// region, instead of receiving large WRITE payloads straight into it.
    #[arg(long = "no-direct")]
    no_direct: bool,
    /// Authenticate every packet (AES-256-GCM) with the job secret in
    /// METAROCE_JOB_SECRET (64 hex digits; both sides must have the same,
    /// which the handshake checks; with --loopback and no secret set, a
    /// random one is used).
    #[arg(long)]
    auth: bool,
    /// Encrypt payloads too (implies --auth).
    #[arg(long)]
    encrypt: bool,
    /// Always compute and check the ICRC [default: both sides agree to
    /// leave it to the UDP checksum when packets are not authenticated].
    #[arg(long)]
    icrc: bool,
    /// Lower bound of every retransmission timeout, microseconds [default:
    /// 4000, a scheduler tick at HZ=250].
    #[arg(long = "rto-min-us")]
    rto_min_us: Option<u64>,
    /// Bytes of data packets sent on one path before the next path's turn,
    /// 0..=1048576 (0: one packet per path in turn, the finest spray).
    /// Runs up to 65536 (what one GSO send carries) let the kernel move a
    /// path's run of small packets as one at both ends: three times the
    /// goodput of per-packet spraying over 1500-byte links, but a failover
    /// that sometimes stalls (docs/real-networks.md) [default: 0].
    #[arg(long = "path-burst", value_parser = clap::value_parser!(u32).range(0..=i64::from(metaroce_udp::MAX_PATH_BURST_BYTES)))]
    path_burst: Option<u32>,
    /// Run the device's engine thread at this niceness (e.g. -10, needs
    /// CAP_SYS_NICE below 0): on a host whose CPUs are contended it keeps
    /// ACKs and timers moving while the application waits for a CPU
    /// [default: the caller's].
    #[arg(long = "engine-nice", allow_negative_numbers = true)]
    engine_nice: Option<i32>,
    /// Stop the application thread's spinning while other threads want its
    /// CPU (once preempted, it blocks on every empty poll for 2 ms, twice
    /// as long each time it is preempted again soon after, up to 800 ms):
    /// a stream keeps more of its bandwidth under a CPU hog, a ping-pong
    /// loses latency to wake-ups
    /// [default: bandwidth tests do, latency tests spin their busy-poll
    /// window whatever the load; the engine thread stops when it waits for
    /// its CPU an eighth of the time or more]
    #[arg(long = "block-when-contended", conflicts_with = "spin_when_contended")]
    block_when_contended: bool,
    /// Keep the application thread spinning its busy-poll window whatever
    /// the load, in bandwidth tests too (see --block-when-contended).
    #[arg(long = "spin-when-contended")]
    spin_when_contended: bool,
    /// perftest's -F (no CPU frequency warning): accepted, ignored.
    #[arg(short = 'F', long = "CPU-freq", hide = true)]
    cpu_freq: bool,
    /// perftest's -d (IB device): accepted, ignored.
    #[arg(short = 'd', long = "ib-dev", hide = true)]
    ib_dev: Option<String>,
    /// perftest's -x (GID index): accepted, ignored.
    #[arg(short = 'x', long = "gid-index", hide = true)]
    gid_index: Option<String>,
    /// perftest's -c (connection type): RC only.
    #[arg(short = 'c', long = "connection", hide = true)]
    connection: Option<String>,
    /// perftest's -b (bidirectional): not supported.
    #[arg(short = 'b', long = "bidirectional", hide = true)]
    bidirectional: bool,
    /// perftest's --report-both: not supported.
    #[arg(long = "report-both", hide = true)]
    report_both: bool,
    /// perftest's -V (version): not supported here.
    #[arg(short = 'V', long = "version", hide = true)]
    version: bool,
}

/// The perftest flags MetaRoCE takes and ignores, with a note on stderr;
/// the ones it refuses, as an error.
fn perftest_flags(args: &PerfArgs) -> Result<(), String> {
    let unsupported = |what: &str| Err(format!("not supported by MetaRoCE: {what}"));
    if args.bidirectional {
        return unsupported("-b (bidirectional bandwidth); run a second pair the other way");
    }
    if args.report_both {
        return unsupported("--report-both (there is no bidirectional test)");
    }
    if args.version {
        return unsupported("-V (perftest's version); `metaroce --version` prints MetaRoCE's");
    }
    if let Some(c) = &args.connection
        && !c.eq_ignore_ascii_case("RC")
    {
        return unsupported(&format!("-c {c} (MetaRoCE has RC connections only)"));
    }
    if let Some(t) = &args.rate_limit_type {
        match t.to_ascii_uppercase().as_str() {
            "SW" => {}
            "HW" | "PP" => {
                return unsupported(&format!(
                    "--rate_limit_type {t} (no NIC pacing here; only SW, the requester's own pacing, is supported)"
                ));
            }
            _ => {
                return Err(format!(
                    "--rate_limit_type {t}: use SW (HW and PP are not supported)"
                ));
            }
        }
    }
    if args.cpu_freq {
        eprintln!("note: -F ignored (MetaRoCE runs no CPU frequency check)");
    }
    if let Some(d) = &args.ib_dev {
        eprintln!(
            "note: -d {d} ignored (MetaRoCE runs over UDP: the route to the peer picks the interface)"
        );
    }
    if let Some(x) = &args.gid_index {
        eprintln!("note: -x {x} ignored (MetaRoCE addresses devices by IP and UDP port, no GID)");
    }
    Ok(())
}

/// The job secret from `METAROCE_JOB_SECRET`, or a random one for a
/// single-process loopback run.
pub(crate) fn job_secret(loopback: bool) -> Result<[u8; 32], String> {
    let secret = match std::env::var("METAROCE_JOB_SECRET") {
        Ok(hex) => {
            let hex = hex.trim();
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err("METAROCE_JOB_SECRET must be 64 hex digits (32 bytes)".into());
            }
            let mut s = [0u8; 32];
            for (i, b) in s.iter_mut().enumerate() {
                *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                    .map_err(|_| "METAROCE_JOB_SECRET must be 64 hex digits (32 bytes)")?;
            }
            s
        }
        Err(_) if loopback => {
            let mut s = [0u8; 32];
            for (i, chunk) in s.chunks_mut(8).enumerate() {
                chunk.copy_from_slice(
                    &(metaroce_udp::os_seed() ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                        .to_le_bytes(),
                );
            }
            s
        }
        Err(_) => return Err("--auth / --encrypt need the job secret in METAROCE_JOB_SECRET (64 hex digits, the same on both sides)".into()),
    };
    metaroce_cm::check_job_secret(&secret).map_err(|e| format!("METAROCE_JOB_SECRET: {e}"))?;
    Ok(secret)
}

fn parse_rate_units(s: &str) -> Result<RateUnits, String> {
    RateUnits::from_flag(s).ok_or_else(|| {
        format!("'{s}' is not a rate unit (M: MiB/s, g: Gb/s, p: messages per second)")
    })
}

/// The software rate limiter's flags, and whether each was given: a
/// client's bandwidth-test options, refused or noted wherever they mean
/// nothing (a latency test, the server, the raw-UDP baselines).
fn rate_limit_flags(args: &PerfArgs) -> [(&'static str, bool); 4] {
    [
        ("--rate_limit", args.rate_limit.is_some()),
        ("--rate_units", args.rate_units.is_some()),
        ("--rate_limit_type", args.rate_limit_type.is_some()),
        ("--burst_size", args.burst_size.is_some()),
    ]
}

/// The software rate limiter asked for, if any. As in perftest, its other
/// options mean nothing without `--rate_limit`, and are refused alone.
fn rate_limit(args: &PerfArgs) -> Result<Option<RateLimit>, String> {
    let Some(rate) = args.rate_limit else {
        if let Some((flag, _)) = rate_limit_flags(args).iter().find(|(_, given)| *given) {
            return Err(format!("{flag} needs --rate_limit RATE"));
        }
        return Ok(None);
    };
    Ok(Some(RateLimit {
        rate,
        units: args.rate_units.unwrap_or_default(),
        burst: args.burst_size,
    }))
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 8, 4K, 1M)"))?;
    n.checked_mul(mult)
        .filter(|&b| (1..=perf::MAX_SIZE).contains(&b))
        .ok_or_else(|| format!("size '{s}' must be 1 B ..= {} B", perf::MAX_SIZE))
}

/// Where the JSON report goes, if anywhere.
fn json_path(args: &PerfArgs) -> Option<PathBuf> {
    match (&args.json, &args.out_json_file) {
        (Some(p), _) | (None, Some(p)) => Some(p.clone()),
        (None, None) => args.out_json.then(|| PathBuf::from("perftest_out.json")),
    }
}

/// A JSON report file opened (created if missing) before the run, so a
/// path that cannot be written fails now; removed again if the run fails
/// and it was created here.
struct JsonOut {
    path: PathBuf,
    created: bool,
}

impl JsonOut {
    fn prepare(path: PathBuf) -> Result<Self, String> {
        if path.is_dir() {
            return Err(format!(
                "--json {}: is a directory, not a file",
                path.display()
            ));
        }
        let created = !path.exists();
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| format!("--json {}: cannot write: {e}", path.display()))?;
        Ok(Self { path, created })
    }

    fn write(self, doc: &impl serde::Serialize) -> Result<(), String> {
        let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?;
        std::fs::write(&self.path, text + "\n")
            .map_err(|e| format!("cannot write --json {}: {e}", self.path.display()))
    }

    fn discard(self) {
        if self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

pub(crate) fn run(args: PerfArgs) -> Result<ExitCode, String> {
    perftest_flags(&args)?;
    if args.loopback && args.host.is_some() {
        return Err("--loopback takes no host".into());
    }
    if args.duration == Some(0) {
        return Err("-D 0: the duration must be at least 1 s".into());
    }
    // Only a client writes the report (a server notes the option).
    let client = args.loopback || args.host.is_some();
    let json = json_path(&args)
        .filter(|_| client)
        .map(JsonOut::prepare)
        .transpose()?;
    match args.test.as_str() {
        "udp-bw" | "udp-lat" => raw_baseline(&args, json),
        _ => rdma_test(&args, json),
    }
}

/// Options only bandwidth tests use, refused for a latency test.
fn refuse_inapplicable(args: &PerfArgs, test: &str, lat: bool) -> Result<(), String> {
    let bw_only = [
        ("-q", args.qps.is_some_and(|q| q != 1)),
        ("-t", args.tx_depth.is_some()),
        ("-Q", args.cq_mod.is_some()),
        ("-l", args.post_list.is_some()),
        ("-N", args.no_peak),
        ("--run_infinitely", args.run_infinitely),
    ];
    let rate_flags = rate_limit_flags(args);
    let mut given = bw_only.iter().chain(&rate_flags);
    if lat && let Some((flag, _)) = given.find(|(_, given)| *given) {
        return Err(format!(
            "{flag} applies to bandwidth tests only ({test} is a latency test)"
        ));
    }
    Ok(())
}

fn rdma_test(args: &PerfArgs, json: Option<JsonOut>) -> Result<ExitCode, String> {
    let test = Test::from_name(&args.test).ok_or_else(|| {
        format!(
            "unknown test '{}' (write-bw, write-lat, read-bw, read-lat, send-bw, send-lat, atomic-bw, atomic-lat, udp-bw, udp-lat)",
            args.test
        )
    })?;
    refuse_inapplicable(args, test.name(), test.is_lat())?;
    if args.inline_size.is_some_and(|i| i > 0)
        && matches!(
            test,
            Test::ReadBw | Test::ReadLat | Test::AtomicBw | Test::AtomicLat
        )
    {
        return Err(format!(
            "-I: {} carries no payload to inline (READ and atomics only)",
            test.name()
        ));
    }
    let size = args.size.unwrap_or(test.default_size());
    // One seed, drawn once, for the device and the pattern: the JSON
    // report records it, so the run can be repeated with --seed.
    let seed = args.seed.unwrap_or_else(metaroce_udp::os_seed);
    let p = Params {
        size,
        iters: args.iters.unwrap_or(test.default_iters()),
        duration_s: match (args.duration, args.run_infinitely) {
            (Some(d), _) => d,
            (None, true) => perf::INFINITE_REPORT_S,
            (None, false) => 0,
        },
        qps: args.qps.unwrap_or(1),
        tx_depth: if test.is_lat() {
            1
        } else {
            args.tx_depth.unwrap_or(128)
        },
        verify: !args.no_verify,
        // 0: each side sizes it from its path to the other.
        mtu: args.mtu.unwrap_or(0),
        paths: args.paths,
        pattern_seed: seed,
        run_infinitely: args.run_infinitely,
        buffer_bytes: args.buffer_bytes,
    };
    p.validate(test)?;
    let measure = Measure {
        cq_mod: args.cq_mod,
        post_list: args.post_list.unwrap_or(perf::POST_LIST),
        inline_bytes: args.inline_size.unwrap_or(test.default_inline_bytes()),
        peak: !args.no_peak && !args.run_infinitely,
    };
    measure.validate()?;
    let rate_limit = rate_limit(args)?;
    if args.all && test.is_atomic() {
        return Err("-a: atomic tests have one size (8 B)".into());
    }
    if args.all && args.run_infinitely {
        return Err("-a and --run_infinitely: an endless run has one size".into());
    }
    let sizes: Vec<u64> = if args.all {
        (1..=23).map(|e| 1u64 << e).collect()
    } else {
        vec![size]
    };
    if let Some(r) = &rate_limit {
        // Against the largest size of a sweep: the one whose messages the
        // limit spaces furthest apart.
        let largest = sizes.iter().copied().max().unwrap_or(size);
        r.validate(&Params {
            size: largest,
            ..p.clone()
        })?;
    }
    let auth = if args.auth || args.encrypt {
        Some(AuthOpts {
            job_secret: job_secret(args.loopback)?,
            encrypt: args.encrypt,
        })
    } else {
        None
    };
    let local = LocalOpts {
        measure,
        auth,
        impair: args.impair,
        seed,
        dev_port: args.dev_port.unwrap_or(metaroce_udp::DEFAULT_DEVICE_PORT),
        dev_port_fallback: args.dev_port.is_none(),
        capture: None,
        offload: !args.no_offload,
        direct_placement: !args.no_direct,
        engine_nice: args.engine_nice,
        block_when_contended: match (args.block_when_contended, args.spin_when_contended) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        icrc_omission: !args.icrc,
        rto_min_ns: args.rto_min_us.unwrap_or(0).saturating_mul(1000),
        path_burst_bytes: args.path_burst,
        rate_limit,
    };
    let capture = Capture::open(args)?;
    let mut local = local;
    local.capture = capture.hook();
    if args.host.is_none() && !args.loopback {
        let r = serve(args, test, &local);
        capture.finish()?;
        return r;
    }
    let stats = stats_wanted(args);
    let gbits = args.report_gbits;
    let duration = p.duration_s > 0;
    let table_header = if test.is_lat() {
        if duration {
            LAT_DURATION_HEADER
        } else {
            LAT_TABLE_HEADER
        }
    } else {
        perf::bw_table_header(gbits)
    };
    if p.run_infinitely {
        // No session ends to print the address lines after: the table
        // comes first, then one row per interval.
        println!("{}", perf::header(test, &p, &local));
        println!("{table_header}");
    }
    let mut on_interval = |f: &BwFigures| println!("{}", perf::bw_row(f, gbits));
    let mut rows = Vec::new();
    let mut failed_verify = false;
    let mut printed_header = p.run_infinitely;
    let mut last_counters = None;
    // What the sessions used (the last one's, for the JSON report).
    let mut used_mtu = p.mtu;
    let mut icrc_omitted = false;
    let mut on_session = |s: &Session| {
        used_mtu = s.mtu;
        icrc_omitted = s.icrc_omitted;
        if !printed_header {
            let used = Params {
                mtu: s.mtu,
                ..p.clone()
            };
            println!("{}", perf::header(test, &used, &local));
            println!(" Path            : {}", s.path.describe());
            println!(
                " ICRC            : {}",
                if s.icrc_omitted {
                    "omitted (UDP checksum; both sides agreed)"
                } else {
                    "on"
                }
            );
            println!("{}", s.local.render("local"));
            println!("{}", s.remote.render("remote"));
            println!("{RESULT_LINE}");
            println!("{table_header}");
            printed_header = true;
        }
        match &s.figures {
            Figures::Bw(f) => println!("{}", perf::bw_row(f, gbits)),
            Figures::Lat(f) => println!("{}", perf::lat_row(f, duration)),
        }
        if s.verified == Some(false) {
            failed_verify = true;
        }
        last_counters = Some(s.counters.clone());
        rows.push((s.figures, s.verified, s.detail.clone()));
    };
    let ran = if args.loopback {
        TcpListener::bind(("127.0.0.1", args.port))
            .map_err(|e| format!("cannot listen on 127.0.0.1:{}: {e}", args.port))
            .and_then(|listener| {
                perf::run_loopback(
                    test,
                    listener,
                    &sizes,
                    &p,
                    &local,
                    &mut on_session,
                    &mut on_interval,
                )
                .map_err(|e| failure(&e, stats))
            })
    } else {
        let host = args.host.as_deref().unwrap_or_default();
        resolve(host, args.port).and_then(|server| {
            for (i, &sz) in sizes.iter().enumerate() {
                let mut pp = p.clone();
                pp.size = sz;
                let last = i + 1 == sizes.len();
                let s = perf::run_client_with(test, server, &pp, &local, last, &mut on_interval)
                    .map_err(|e| failure(&e, stats))?;
                on_session(&s);
            }
            Ok(())
        })
    };
    let captured = capture.finish();
    if let Err(e) = ran {
        if let Some(j) = json {
            j.discard();
        }
        return Err(e);
    }
    captured?;
    println!("{RESULT_LINE}");
    for (_, v, detail) in &rows {
        if let Some(v) = v {
            println!(
                " data {}: {detail}",
                if *v {
                    "verified"
                } else {
                    "VERIFICATION FAILED"
                }
            );
        }
    }
    let counter_lines = last_counters.as_ref().map(DeviceCounters::lines);
    if stats && let Some(c) = &last_counters {
        print_counters(c, "client");
    }
    if let Some(j) = json {
        let mut last = p.clone();
        last.size = *sizes.last().unwrap_or(&size);
        let figures: Vec<Figures> = rows.iter().map(|r| r.0).collect();
        j.write(&perf::json_report(&JsonRun {
            test,
            params: &last,
            mtu: used_mtu,
            icrc_omitted,
            local: &local,
            gbits,
            all_sizes: args.all,
            figures: &figures,
            counters: counter_lines.as_deref(),
        }))?;
    }
    if failed_verify {
        return Err("received data differs from what was sent".into());
    }
    Ok(ExitCode::SUCCESS)
}

/// Server mode: serve the client's sessions. The server adopts the
/// client's parameters; the ones given here are noted, not used.
fn serve(args: &PerfArgs, test: Test, local: &LocalOpts) -> Result<ExitCode, String> {
    let client_side = [
        ("-s", args.size.is_some()),
        ("-n", args.iters.is_some()),
        ("-a", args.all),
        ("-D", args.duration.is_some()),
        ("-q", args.qps.is_some()),
        ("-t", args.tx_depth.is_some()),
        ("-Q", args.cq_mod.is_some()),
        ("-l", args.post_list.is_some()),
        ("-N", args.no_peak),
        ("-m", args.mtu.is_some()),
        ("--run_infinitely", args.run_infinitely),
        ("--no-verify", args.no_verify),
        ("--report_gbits", args.report_gbits),
        ("--json", json_path(args).is_some()),
    ];
    let given: Vec<&str> = client_side
        .iter()
        .chain(&rate_limit_flags(args))
        .filter(|(_, g)| *g)
        .map(|(f, _)| *f)
        .collect();
    if !given.is_empty() {
        eprintln!(
            "note: the server runs what the client asks and the client reports; {} given here are the client's to choose",
            given.join(" ")
        );
    }
    let listener = TcpListener::bind(("0.0.0.0", args.port))
        .map_err(|e| format!("cannot listen on port {}: {e}", args.port))?;
    println!(
        "{}\n                    {} (server)\n Waiting for client on port {}\n{RESULT_LINE}",
        RESULT_LINE,
        test.title(),
        args.port
    );
    let stats = stats_wanted(args);
    perf::serve(&listener, test, local, &mut |s| {
        println!("{}", s.local.render("local"));
        println!("{}", s.remote.render("remote"));
        println!(
            " size {} B: {}{}",
            s.params.size,
            match s.report.verified {
                Some(true) => "verified",
                Some(false) => "VERIFICATION FAILED",
                None => "not verified",
            },
            if s.report.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", s.report.detail)
            }
        );
        if stats {
            print_counters(&s.counters, "server");
        }
    })
    .map_err(|e| failure(&e, stats))?;
    println!("{RESULT_LINE}");
    Ok(ExitCode::SUCCESS)
}

/// `--stats`, or `METAROCE_STATS` set to anything but 0 or empty.
fn stats_wanted(args: &PerfArgs) -> bool {
    args.stats || std::env::var("METAROCE_STATS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A device's counters as `name value` lines under one heading line.
fn print_counters(c: &DeviceCounters, side: &str) {
    println!("# counters of the {side} device {}", c.addr);
    print!("{}", metaroce_udp::format_counter_lines(&c.lines()));
}

/// A failed run's message, its device's counters printed first if asked.
fn failure(e: &perf::PerfError, stats: bool) -> String {
    if stats && let Some(c) = e.counters() {
        print_counters(c, "failed");
    }
    e.to_string()
}

/// `--pcap`: the capture file, open before the run so a path that cannot
/// be written fails at once.
struct Capture {
    pcap: Option<(PathBuf, Arc<PcapCapture>)>,
}

impl Capture {
    fn open(args: &PerfArgs) -> Result<Self, String> {
        if args.pcap.is_none() && args.pcap_snaplen.is_some() {
            return Err("--pcap-snaplen needs --pcap FILE".into());
        }
        let Some(path) = &args.pcap else {
            return Ok(Self { pcap: None });
        };
        let snaplen = args.pcap_snaplen.unwrap_or(metaroce_udp::DEFAULT_SNAPLEN);
        if snaplen == 0 {
            return Err("--pcap-snaplen 0: keep at least 1 byte of each frame".into());
        }
        let pcap = PcapCapture::create(path, snaplen)
            .map_err(|e| format!("--pcap {}: {e}", path.display()))?;
        Ok(Self {
            pcap: Some((path.clone(), Arc::new(pcap))),
        })
    }

    fn hook(&self) -> Option<Arc<dyn CaptureHook>> {
        self.pcap
            .as_ref()
            .map(|(_, p)| Arc::clone(p) as Arc<dyn CaptureHook>)
    }

    /// Close the file and say what it holds (on stderr: stdout is the
    /// report).
    fn finish(&self) -> Result<(), String> {
        let Some((path, pcap)) = &self.pcap else {
            return Ok(());
        };
        let n = pcap
            .finish()
            .map_err(|e| format!("--pcap {}: {e}", path.display()))?;
        let v6 = pcap.skipped_ipv6();
        let note = if v6 > 0 {
            format!(" ({v6} IPv6 datagrams left out)")
        } else {
            String::new()
        };
        eprintln!("pcap: {n} packets written to {}{note}", path.display());
        Ok(())
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("bad server address '{host}': {e}"))?
        .next()
        .ok_or_else(|| format!("bad server address '{host}': no address"))
}

/// The payload MTU a MetaRoCE run with these arguments would use toward
/// the baseline's peer (127.0.0.1 with --loopback, else the host), so the
/// raw baseline sends datagrams of the same size.
fn raw_mtu(args: &PerfArgs) -> Result<u32, String> {
    let peer = match (&args.host, args.loopback) {
        (Some(h), false) => resolve(h, args.port)?.ip(),
        _ => std::net::IpAddr::from([127, 0, 0, 1]),
    };
    let local = if peer.is_loopback() {
        peer
    } else {
        std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))
            .and_then(|s| s.connect((peer, 9)).and_then(|()| s.local_addr()))
            .map(|a| a.ip())
            .map_err(|e| format!("no route to {peer}: {e}"))?
    };
    let path = metaroce_udp::pmtu::probe_path(local, peer)
        .map_err(|e| format!("path MTU to {peer}: {e}"))?;
    perf::payload_mtu(args.mtu.unwrap_or(0), &path, false, local, peer)
}

fn raw_baseline(args: &PerfArgs, json: Option<JsonOut>) -> Result<ExitCode, String> {
    let result = raw_run(args);
    match (result, json) {
        (Ok((code, Some(doc))), Some(j)) => {
            j.write(&doc)?;
            Ok(code)
        }
        (Ok((code, _)), j) => {
            if let Some(j) = j {
                j.discard();
            }
            Ok(code)
        }
        (Err(e), j) => {
            if let Some(j) = j {
                j.discard();
            }
            Err(e)
        }
    }
}

/// A raw baseline's JSON report: perftest's layout, as for the RDMA tests.
#[derive(serde::Serialize)]
struct RawReport {
    schema_version: u32,
    test_info: RawInfo,
    results: perf::JsonResults,
    parameters: RawJsonParams,
}

#[derive(serde::Serialize)]
struct RawInfo {
    test: &'static str,
    #[serde(rename = "Device")]
    device: &'static str,
    #[serde(rename = "Transport_type")]
    transport_type: &'static str,
    #[serde(rename = "Mtu")]
    mtu: u32,
    #[serde(rename = "BW_unit")]
    bw_unit: &'static str,
}

#[derive(serde::Serialize)]
struct RawJsonParams {
    test: &'static str,
    size: u64,
    datagram_bytes: usize,
    duration_s: f64,
    iters: u64,
    offload: bool,
    mtu: u32,
    mtu_from_path: bool,
    report_gbits: bool,
}

/// A raw-UDP baseline run, and its JSON report (client side only).
fn raw_run(args: &PerfArgs) -> Result<(ExitCode, Option<RawReport>), String> {
    let gbits = args.report_gbits;
    let test = if args.test == "udp-bw" {
        RawTest::UdpBw
    } else {
        RawTest::UdpLat
    };
    // What the raw baselines have no use for is refused, not ignored.
    let rdma_only = [
        ("-n", args.iters.is_some() && test == RawTest::UdpBw),
        ("-a", args.all),
        ("-q", args.qps.is_some()),
        ("-t", args.tx_depth.is_some()),
        ("-Q", args.cq_mod.is_some()),
        ("-l", args.post_list.is_some()),
        ("-I", args.inline_size.is_some()),
        ("-N", args.no_peak),
        ("--run_infinitely", args.run_infinitely),
        ("--paths", args.paths != 16),
        ("--no-verify", args.no_verify),
        ("--impair", args.impair.is_some()),
        ("--seed", args.seed.is_some()),
        ("--dev-port", args.dev_port.is_some()),
        ("--stats", args.stats),
        ("--pcap", args.pcap.is_some()),
        ("--pcap-snaplen", args.pcap_snaplen.is_some()),
        ("--auth", args.auth),
        ("--encrypt", args.encrypt),
        ("--icrc", args.icrc),
        ("--rto-min-us", args.rto_min_us.is_some()),
        ("--path-burst", args.path_burst.is_some()),
        ("--engine-nice", args.engine_nice.is_some()),
        ("--block-when-contended", args.block_when_contended),
        ("--spin-when-contended", args.spin_when_contended),
    ];
    let rate_flags = rate_limit_flags(args);
    let mut given = rdma_only.iter().chain(&rate_flags);
    if let Some((flag, _)) = given.find(|(_, given)| *given) {
        return Err(format!(
            "{flag} does not apply to {} (raw UDP, no MetaRoCE protocol)",
            args.test
        ));
    }
    let size = args.size.unwrap_or(match test {
        RawTest::UdpBw => 65_536,
        RawTest::UdpLat => 2,
    });
    if test == RawTest::UdpLat && size > 65_000 {
        return Err(format!(
            "-s {size}: udp-lat sends one datagram (at most 65000 B)"
        ));
    }
    if let Some(m) = args.mtu
        && !(64..=65_000).contains(&m)
    {
        return Err(format!("--mtu {m} must be 64..=65000"));
    }
    let mtu = raw_mtu(args)?;
    let iters = args.iters.unwrap_or(1000);
    if iters < 5 {
        return Err(format!("-n {iters} must be at least 5"));
    }
    let p = RawParams {
        test,
        size,
        // Same datagram size as the device: MTU payload plus MetaRoCE headers.
        seg: mtu as usize + 56,
        secs: match test {
            RawTest::UdpBw => args.duration.unwrap_or(2) as f64,
            RawTest::UdpLat => args.duration.unwrap_or(0) as f64,
        },
        iters,
        offload: !args.no_offload,
    };
    let (fig, where_) = if args.loopback {
        let fig = match test {
            RawTest::UdpBw => Figures::Bw(
                raw::udp_bw(p.size, p.seg, p.secs, p.offload).map_err(|e| e.to_string())?,
            ),
            RawTest::UdpLat => Figures::Lat(
                raw::udp_lat(p.size as usize, p.iters, p.secs).map_err(|e| e.to_string())?,
            ),
        };
        (fig, "127.0.0.1".to_string())
    } else if let Some(host) = &args.host {
        let server = resolve(host, args.port)?;
        let (bw, lat) = raw::run_raw_client(server, &p).map_err(|e| e.to_string())?;
        let fig = match (bw, lat) {
            (Some(b), _) => Figures::Bw(b),
            (_, Some(l)) => Figures::Lat(l),
            _ => return Err("the server reported nothing".into()),
        };
        (fig, server.to_string())
    } else {
        let listener = TcpListener::bind(("0.0.0.0", args.port))
            .map_err(|e| format!("cannot listen on port {}: {e}", args.port))?;
        println!(
            "{RESULT_LINE}\n                    Raw UDP {} (server)\n Waiting for client on port {}\n{RESULT_LINE}",
            test.name(),
            args.port
        );
        raw::serve_raw(&listener, test, p.offload).map_err(|e| e.to_string())?;
        println!(" run served");
        return Ok((ExitCode::SUCCESS, None));
    };
    println!("{RESULT_LINE}");
    println!(
        "                    Raw UDP {} ({where_}, no protocol)",
        args.test
    );
    println!("{RESULT_LINE}");
    let duration = args.duration.is_some();
    match &fig {
        Figures::Bw(f) => {
            println!("{}", perf::bw_table_header(gbits));
            println!("{}", perf::bw_row(f, gbits));
        }
        Figures::Lat(f) => {
            println!(
                "{}",
                if duration {
                    LAT_DURATION_HEADER
                } else {
                    LAT_TABLE_HEADER
                }
            );
            println!("{}", perf::lat_row(f, duration));
        }
    }
    println!("{RESULT_LINE}");
    let doc = RawReport {
        schema_version: perf::JSON_SCHEMA_VERSION,
        test_info: RawInfo {
            test: if test == RawTest::UdpBw {
                "Raw_UDP_BW_Test"
            } else {
                "Raw_UDP_Latency_Test"
            },
            device: "udp",
            transport_type: "UDP (no protocol)",
            mtu,
            bw_unit: if gbits { "Gb/sec" } else { "MiB/sec" },
        },
        results: perf::json_results(&fig, gbits, duration),
        parameters: RawJsonParams {
            test: if test == RawTest::UdpBw {
                "udp-bw"
            } else {
                "udp-lat"
            },
            size: p.size,
            datagram_bytes: p.seg,
            duration_s: p.secs,
            iters: p.iters,
            offload: p.offload,
            mtu,
            mtu_from_path: args.mtu.is_none(),
            report_gbits: gbits,
        },
    };
    Ok((ExitCode::SUCCESS, Some(doc)))
}
