//! `metaroce perf`: perftest-style tools over the real UDP datapath.
//!
//! `metaroce perf write-bw` (server) / `metaroce perf write-bw HOST`
//! (client) / `metaroce perf write-bw --loopback` (both in one process).
//! Tests: write-bw, write-lat, read-bw, read-lat, send-bw, send-lat,
//! atomic-bw, atomic-lat, and the raw-UDP baselines udp-bw, udp-lat.

use metaroce_perf::raw::{self, RawParams, RawTest};
use metaroce_perf::{
    self as perf, AuthOpts, Figures, LAT_DURATION_HEADER, LAT_TABLE_HEADER, LocalOpts, Params,
    RESULT_LINE, Session, Test,
};
use metaroce_udp::Impair;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::process::ExitCode;

/// Arguments of `metaroce perf`.
#[derive(clap::Args, Debug)]
pub(crate) struct PerfArgs {
    /// Test: write-bw, write-lat, read-bw, read-lat, send-bw, send-lat,
    /// atomic-bw, atomic-lat, udp-bw, udp-lat.
    test: String,
    /// Server host (client mode); none: server mode.
    host: Option<String>,
    /// Run server and client in this process over 127.0.0.1.
    #[arg(long)]
    loopback: bool,
    /// Message size in bytes (K, M suffixes are binary).
    #[arg(short = 's', long = "size", value_parser = parse_size)]
    size: Option<u64>,
    /// Iterations.
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// Sweep sizes 2 ..= 2^23 (powers of two).
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Run for this many seconds instead of an iteration count.
    #[arg(short = 'D', long = "duration")]
    duration: Option<u64>,
    /// Number of QPs.
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: u32,
    /// Outstanding work requests per QP (TX depth).
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: u32,
    /// Report Gb/s instead of MiB/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// TCP port of the side channel.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Paths (UDP source ports) per connection.
    #[arg(long, default_value_t = 16)]
    paths: u32,
    /// Payload bytes per packet. Default: sized from the path to the peer
    /// (the largest whose packets leave unfragmented, at most 8192); an
    /// explicit value the path cannot carry is an error.
    #[arg(long)]
    mtu: Option<u32>,
    /// Write the results as JSON (perftest out_json key names) to FILE.
    #[arg(long)]
    json: Option<String>,
    /// Do not verify transferred data.
    #[arg(long = "no-verify")]
    no_verify: bool,
    /// Receive-side impairment, e.g. loss=0.01,reorder=0.05,dup=0.01,seed=7.
    #[arg(long, value_parser = |s: &str| s.parse::<Impair>())]
    impair: Option<Impair>,
    /// Seed of the device (keys, PSNs, ports); default: from the OS.
    #[arg(long)]
    seed: Option<u64>,
    /// MetaRoCE device UDP port (0: a free range is picked).
    #[arg(long = "dev-port", default_value_t = 0)]
    dev_port: u16,
    /// Turn off UDP GSO and GRO.
    #[arg(long = "no-offload")]
    no_offload: bool,
    /// Authenticate every packet (AES-256-GCM) with the job secret in
    /// METAROCE_JOB_SECRET (64 hex digits; both sides must have it; with
    /// --loopback and no secret set, a random one is used).
    #[arg(long)]
    auth: bool,
    /// Encrypt payloads too (implies --auth).
    #[arg(long)]
    encrypt: bool,
    /// Always compute and check the ICRC (by default both sides agree to
    /// leave it to the UDP checksum when packets are not authenticated).
    #[arg(long)]
    icrc: bool,
    /// Lower bound of every retransmission timeout, microseconds (default
    /// 4000: a scheduler tick at HZ=250).
    #[arg(long = "rto-min-us")]
    rto_min_us: Option<u64>,
    /// Run the device's engine thread at this niceness (e.g. -10, needs
    /// CAP_SYS_NICE below 0): on a host whose CPUs are contended it keeps
    /// ACKs and timers moving while the application waits for a CPU.
    #[arg(long = "engine-nice", allow_negative_numbers = true)]
    engine_nice: Option<i32>,
}

/// The job secret from `METAROCE_JOB_SECRET`, or a random one for a
/// single-process loopback run.
fn job_secret(loopback: bool) -> Result<[u8; 32], String> {
    match std::env::var("METAROCE_JOB_SECRET") {
        Ok(hex) => {
            let hex = hex.trim();
            let bytes: Option<Vec<u8>> = (hex.len() == 64)
                .then(|| {
                    (0..32)
                        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
                        .collect()
                })
                .flatten();
            bytes
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or_else(|| "METAROCE_JOB_SECRET must be 64 hex digits (32 bytes)".into())
        }
        Err(_) if loopback => {
            let mut s = [0u8; 32];
            for (i, chunk) in s.chunks_mut(8).enumerate() {
                chunk.copy_from_slice(
                    &(metaroce_udp::os_seed() ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                        .to_le_bytes(),
                );
            }
            Ok(s)
        }
        Err(_) => Err("--auth / --encrypt need the job secret in METAROCE_JOB_SECRET (64 hex digits, the same on both sides)".into()),
    }
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

pub(crate) fn run(args: PerfArgs) -> Result<ExitCode, String> {
    match args.test.as_str() {
        "udp-bw" | "udp-lat" => return raw_baseline(&args),
        _ => {}
    }
    let test = Test::from_name(&args.test).ok_or_else(|| {
        format!(
            "unknown test '{}' (write-bw, write-lat, read-bw, read-lat, send-bw, send-lat, atomic-bw, atomic-lat, udp-bw, udp-lat)",
            args.test
        )
    })?;
    let size = args.size.unwrap_or(test.default_size());
    let p = Params {
        size,
        iters: args.iters.unwrap_or(test.default_iters()),
        duration_s: args.duration.unwrap_or(0),
        qps: if test.is_lat() { 1 } else { args.qps },
        tx_depth: if test.is_lat() { 1 } else { args.tx_depth },
        verify: !args.no_verify,
        mtu: args.mtu.unwrap_or(0),
        paths: args.paths,
        pattern_seed: args.seed.unwrap_or_else(metaroce_udp::os_seed),
    };
    if args.duration == Some(0) {
        return Err("-D 0: the duration must be at least 1 s".into());
    }
    p.validate(test)?;
    if args.all && test.is_atomic() {
        return Err("-a: atomic tests have one size (8 B)".into());
    }
    let sizes: Vec<u64> = if args.all {
        (1..=23).map(|e| 1u64 << e).collect()
    } else {
        vec![size]
    };
    let auth = if args.auth || args.encrypt {
        Some(AuthOpts {
            job_secret: job_secret(args.loopback)?,
            encrypt: args.encrypt,
        })
    } else {
        None
    };
    let local = LocalOpts {
        auth,
        impair: args.impair,
        seed: args.seed.unwrap_or_else(metaroce_udp::os_seed),
        dev_port: args.dev_port,
        offload: !args.no_offload,
        engine_nice: args.engine_nice,
        icrc_omission: !args.icrc,
        rto_min_ns: args.rto_min_us.unwrap_or(0).saturating_mul(1000),
    };
    let mut rows = Vec::new();
    let mut failed_verify = false;
    let mut printed_header = false;
    let gbits = args.report_gbits;
    let duration = p.duration_s > 0;
    let mut on_session = |s: &Session| {
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
            println!(
                "{}",
                match s.figures {
                    Figures::Bw(_) => perf::bw_table_header(gbits),
                    Figures::Lat(_) if duration => LAT_DURATION_HEADER,
                    Figures::Lat(_) => LAT_TABLE_HEADER,
                }
            );
            printed_header = true;
        }
        match &s.figures {
            Figures::Bw(f) => println!("{}", perf::bw_row(f, gbits)),
            Figures::Lat(f) => println!("{}", perf::lat_row(f, duration)),
        }
        if s.verified == Some(false) {
            failed_verify = true;
        }
        if std::env::var_os("METAROCE_STATS").is_some() {
            eprintln!("client stats: {:?}", s.stats);
        }
        rows.push((s.figures, s.verified, s.detail.clone()));
    };
    if args.loopback {
        if args.host.is_some() {
            return Err("--loopback takes no host".into());
        }
        let listener = TcpListener::bind(("127.0.0.1", args.port))
            .map_err(|e| format!("cannot listen on 127.0.0.1:{}: {e}", args.port))?;
        perf::run_loopback(test, listener, &sizes, &p, &local, &mut on_session)
            .map_err(|e| e.to_string())?;
    } else if let Some(host) = &args.host {
        let server = resolve(host, args.port)?;
        for (i, &sz) in sizes.iter().enumerate() {
            let mut pp = p.clone();
            pp.size = sz;
            let s = perf::run_client(test, server, &pp, &local, i + 1 == sizes.len())
                .map_err(|e| e.to_string())?;
            on_session(&s);
        }
    } else {
        let listener = TcpListener::bind(("0.0.0.0", args.port))
            .map_err(|e| format!("cannot listen on port {}: {e}", args.port))?;
        println!(
            "{}\n                    {} (server)\n Waiting for client on port {}\n{RESULT_LINE}",
            RESULT_LINE,
            test.title(),
            args.port
        );
        perf::serve(&listener, test, &local, &mut |s| {
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
        })
        .map_err(|e| e.to_string())?;
        println!("{RESULT_LINE}");
        return Ok(ExitCode::SUCCESS);
    }
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
    if let Some(path) = &args.json {
        write_json(
            path,
            test.name(),
            &rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            gbits,
        )?;
    }
    if failed_verify {
        return Err("received data differs from what was sent".into());
    }
    Ok(ExitCode::SUCCESS)
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("bad server address '{host}': {e}"))?
        .next()
        .ok_or_else(|| format!("bad server address '{host}': no address"))
}

fn write_json(path: &str, test: &str, figs: &[Figures], gbits: bool) -> Result<(), String> {
    let results: Vec<_> = figs.iter().map(|f| perf::json_row(f, gbits)).collect();
    let doc = serde_json::json!({
        "test": test,
        "BW_unit": if gbits { "Gb/sec" } else { "MiB/sec" },
        "lat_unit": "usec",
        "results": results,
    });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("cannot write --json {path}: {e}"))
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
    perf::payload_mtu(args.mtu.unwrap_or(0), &path, false, peer)
}

fn raw_baseline(args: &PerfArgs) -> Result<ExitCode, String> {
    let gbits = args.report_gbits;
    let test = if args.test == "udp-bw" {
        RawTest::UdpBw
    } else {
        RawTest::UdpLat
    };
    let size = args.size.unwrap_or(match test {
        RawTest::UdpBw => 65_536,
        RawTest::UdpLat => 2,
    });
    if test == RawTest::UdpLat && size > 65_000 {
        return Err(format!(
            "-s {size}: udp-lat sends one datagram (at most 65000 B)"
        ));
    }
    let p = RawParams {
        test,
        size,
        // Same datagram size as the device: MTU payload plus MetaRoCE headers.
        seg: raw_mtu(args)? as usize + 56,
        secs: match test {
            RawTest::UdpBw => args.duration.unwrap_or(2) as f64,
            RawTest::UdpLat => args.duration.unwrap_or(0) as f64,
        },
        iters: args.iters.unwrap_or(1000).max(5),
        offload: !args.no_offload,
    };
    let (fig, where_) = if args.loopback {
        if args.host.is_some() {
            return Err("--loopback takes no host".into());
        }
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
        return Ok(ExitCode::SUCCESS);
    };
    println!("{RESULT_LINE}");
    println!(
        "                    Raw UDP {} ({where_}, no protocol)",
        args.test
    );
    println!("{RESULT_LINE}");
    match &fig {
        Figures::Bw(f) => {
            println!("{}", perf::bw_table_header(gbits));
            println!("{}", perf::bw_row(f, gbits));
        }
        Figures::Lat(f) => {
            let d = args.duration.is_some();
            println!(
                "{}",
                if d {
                    LAT_DURATION_HEADER
                } else {
                    LAT_TABLE_HEADER
                }
            );
            println!("{}", perf::lat_row(f, d));
        }
    }
    println!("{RESULT_LINE}");
    if let Some(path) = &args.json {
        write_json(path, &args.test, &[fig], gbits)?;
    }
    Ok(ExitCode::SUCCESS)
}
