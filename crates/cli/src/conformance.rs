//! `metaroce conformance --target HOST` (the suite, `metaroce-conformance`)
//! and `metaroce conformance-responder` (a MetaRoCE device set up as the
//! suite's contract asks), wired over the connection manager as
//! `docs/spec/conformance.md` describes:
//!
//! 1. the suite connects over TCP and sends `Hello` with `test:
//!    "conformance"`, `params: {}` and its endpoint (device port, 5 QPNs,
//!    session id, packet protection);
//! 2. the responder starts a fresh device with 5 RC QPs in RTS toward the
//!    suite's QPs, one region of 1 MiB with every remote right and no
//!    receives posted, and answers `Accept` with its endpoint (and, with
//!    packet authentication, its key confirmation, which the suite checks
//!    and answers with `Confirm`, as the perf tools do);
//! 3. the suite runs its checks over UDP, then sends `Done`; the responder
//!    answers `Report` with its device's counters and closes the device.

use metaroce_cm::{
    self as cm, Confirm, Endpoint, Hello, KeyConfirmation, MsgType, RemoteBuf, Role,
};
use metaroce_conformance::{AuthSetup, Config, MIN_QPS, TargetInfo, UdpLink};
use metaroce_udp::{Device, DeviceConfig};
use metaroce_verbs::{
    AccessFlags, AuthConfig, EndpointConfig, QpAttr, QpCaps, QpInitAttr, QpState, QpType,
};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::process::ExitCode;
use std::time::Duration;

/// The connection manager's TCP port for conformance runs.
const DEFAULT_CM_PORT: u16 = 18_520;
/// The responder's region: the suite needs at least 64 KiB.
const REGION_BYTES: u64 = 1 << 20;
/// The Hello's `test` name.
const TEST_NAME: &str = "conformance";

/// Packet protection options shared by both commands.
#[derive(clap::Args, Debug, Clone, Copy)]
pub(crate) struct Protection {
    /// Authenticate every packet (AES-256-GCM) with the job secret in
    /// METAROCE_JOB_SECRET (64 hex digits, a test secret, the same on
    /// both sides; the handshake checks it).
    #[arg(long)]
    auth: bool,
    /// Encrypt payloads too (implies --auth).
    #[arg(long)]
    encrypt: bool,
}

impl Protection {
    fn mode(self) -> &'static str {
        if self.encrypt {
            "encrypted"
        } else if self.auth {
            "authenticated"
        } else {
            "none"
        }
    }

    fn secret(self) -> Result<Option<[u8; 32]>, String> {
        if self.auth || self.encrypt {
            crate::perf::job_secret(false).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Arguments of `metaroce conformance`.
#[derive(clap::Args, Debug)]
pub(crate) struct ConformanceArgs {
    /// The target's host (running `metaroce conformance-responder` or any
    /// responder that keeps the contract in docs/spec/conformance.md).
    #[arg(long)]
    target: String,
    /// TCP port of the target's connection manager.
    #[arg(short = 'p', long, default_value_t = DEFAULT_CM_PORT)]
    port: u16,
    #[command(flatten)]
    protection: Protection,
    /// Run only the checks whose id starts with PREFIX (repeatable, or
    /// comma separated), e.g. `--only sack.,drop.`.
    #[arg(long, value_name = "PREFIX", value_delimiter = ',')]
    only: Vec<String>,
}

/// Arguments of `metaroce conformance-responder`.
#[derive(clap::Args, Debug)]
pub(crate) struct ResponderArgs {
    /// TCP port of the connection manager to listen on.
    #[arg(short = 'p', long, default_value_t = DEFAULT_CM_PORT)]
    port: u16,
    /// Address to listen on (the device binds the address each suite
    /// connects to).
    #[arg(long, default_value = "0.0.0.0")]
    bind: IpAddr,
    #[command(flatten)]
    protection: Protection,
    /// Device UDP port; 0: a free range [default: 4793, or a free range
    /// when that is taken].
    #[arg(long = "dev-port")]
    dev_port: Option<u16>,
    /// Serve one suite run, then exit.
    #[arg(long)]
    once: bool,
}

// ------------------------------------------------------------- the suite

pub(crate) fn run_suite(args: &ConformanceArgs) -> Result<ExitCode, String> {
    let secret = args.protection.secret()?;
    let mode = args.protection.mode();
    let server = (args.target.as_str(), args.port)
        .to_socket_addrs()
        .map_err(|e| format!("--target {}: {e}", args.target))?
        .next()
        .ok_or_else(|| format!("--target {}: no address", args.target))?;
    let mut tcp = TcpStream::connect_timeout(&server, Duration::from_secs(5))
        .map_err(|e| format!("cannot reach the responder at {server}: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let local_ip = tcp.local_addr().map_err(|e| e.to_string())?.ip();
    let target_ip = tcp.peer_addr().map_err(|e| e.to_string())?.ip();
    // The suite's device: one UDP socket, whose port is announced.
    let socket = UdpSocket::bind(SocketAddr::new(local_ip, 0))
        .map_err(|e| format!("UDP socket on {local_ip}: {e}"))?;
    let local = socket.local_addr().map_err(|e| e.to_string())?;
    let local_qpns: Vec<u32> = (0..MIN_QPS as u32).map(|i| 0x00c0_0000 + i).collect();
    let session_id = metaroce_udp::os_seed() | 1;
    let hello = Hello {
        test: TEST_NAME.into(),
        params: serde_json::json!({}),
        endpoint: Endpoint {
            device_port: local.port(),
            path_port_span: 0,
            mtu: 4096,
            qpns: local_qpns.clone(),
            buf: RemoteBuf {
                addr: 0,
                rkey: 0,
                len: 0,
            },
            session_id,
            auth: mode.into(),
            // The suite's packets carry their ICRC: the checks of a bad
            // ICRC need the target to verify it.
            icrc_omission: false,
            key_confirm: None,
            setup_grant_mbps: None,
        },
        last: true,
    };
    let cm_err = |e: cm::CmError| format!("connection manager: {e}");
    cm::send(&mut tcp, MsgType::Hello, &hello).map_err(cm_err)?;
    let accept: Endpoint = cm::recv(&mut tcp, MsgType::Accept).map_err(cm_err)?;
    if accept.auth != mode {
        return Err(format!(
            "the responder runs packet protection {:?}, this suite {mode:?}",
            accept.auth
        ));
    }
    if let Some(secret) = &secret {
        let at = |role| KeyConfirmation::new(secret, role, session_id, accept.session_id, mode);
        at(Role::Server)
            .verify(accept.key_confirm.as_deref())
            .map_err(|e| format!("{e} (METAROCE_JOB_SECRET must be the same on both sides)"))?;
        let confirm = Confirm {
            key_confirm: at(Role::Client).to_hex(),
        };
        cm::send(&mut tcp, MsgType::Confirm, &confirm).map_err(cm_err)?;
    }
    let target = TargetInfo {
        addr: SocketAddr::new(target_ip, accept.device_port),
        qpns: accept.qpns.clone(),
        rkey: accept.buf.rkey,
        region_addr: accept.buf.addr,
        region_len: accept.buf.len,
        session_id: accept.session_id,
        initial_psn: Default::default(),
        first_msg_seq: 0,
    };
    let mut config = Config::new(local, local_qpns, session_id);
    config.auth = secret.map(|job_secret| AuthSetup {
        job_secret,
        encrypt: args.protection.encrypt,
    });
    config.only.clone_from(&args.only);
    println!(
        "conformance: suite at {local}, target {} ({} QPs, region {} B, protection {mode})",
        target.addr,
        target.qpns.len(),
        target.region_len
    );
    let link = UdpLink::from_socket(socket, target.addr);
    let report =
        metaroce_conformance::run_with_link(link, &target, &config).map_err(|e| e.to_string())?;
    println!("{report}");
    // Tell the responder the run is over; its counters come back.
    let _ = cm::send(&mut tcp, MsgType::Done, &serde_json::json!({}));
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = cm::recv::<serde_json::Value>(&mut tcp, MsgType::Report);
    Ok(if report.all_passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

// --------------------------------------------------------- the responder

pub(crate) fn run_responder(args: &ResponderArgs) -> Result<ExitCode, String> {
    let secret = args.protection.secret()?;
    let listener = TcpListener::bind((args.bind, args.port))
        .map_err(|e| format!("cannot listen on {}:{}: {e}", args.bind, args.port))?;
    println!(
        "conformance responder: listening on {} (protection {})",
        listener.local_addr().map_err(|e| e.to_string())?,
        args.protection.mode()
    );
    loop {
        let (mut tcp, peer) = listener.accept().map_err(|e| e.to_string())?;
        match serve_one(&mut tcp, args, secret) {
            Ok(()) => println!("conformance responder: run from {peer} done"),
            Err(e) => {
                let _ = cm::send(&mut tcp, MsgType::Error, &e);
                eprintln!("conformance responder: run from {peer}: {e}");
                if args.once {
                    return Err(e);
                }
            }
        }
        if args.once {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// One suite run: a fresh device kept to the contract, until `Done`.
fn serve_one(
    tcp: &mut TcpStream,
    args: &ResponderArgs,
    secret: Option<[u8; 32]>,
) -> Result<(), String> {
    let cm_err = |e: cm::CmError| format!("connection manager: {e}");
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let hello: Hello<serde_json::Value> = cm::recv(tcp, MsgType::Hello).map_err(cm_err)?;
    if hello.test != TEST_NAME {
        return Err(format!(
            "this responder runs {TEST_NAME:?}, the client asked for {:?}",
            hello.test
        ));
    }
    let mode = args.protection.mode();
    if hello.endpoint.auth != mode {
        return Err(format!(
            "packet protection differs: responder {mode}, suite {} (--auth / --encrypt must match)",
            hello.endpoint.auth
        ));
    }
    if hello.endpoint.qpns.len() < MIN_QPS {
        return Err(format!(
            "the suite announced {} QPs; the contract pairs {MIN_QPS}",
            hello.endpoint.qpns.len()
        ));
    }
    let my_ip = tcp.local_addr().map_err(|e| e.to_string())?.ip();
    let peer_ip = tcp.peer_addr().map_err(|e| e.to_string())?.ip();
    let mut ep = EndpointConfig {
        device_port: args.dev_port.unwrap_or(metaroce_udp::DEFAULT_DEVICE_PORT),
        seed: metaroce_udp::os_seed(),
        // Real sockets on a shared machine (see metaroce-perf's rig).
        base_rtt_ns: 50_000,
        rto_min_ns: 4_000_000,
        ..EndpointConfig::default()
    };
    ep.auth = secret.map(|job_secret| AuthConfig {
        job_secret,
        encrypt: args.protection.encrypt,
        local_ip: my_ip,
    });
    let mut dc = DeviceConfig::new(ep, my_ip);
    dc.port_fallback = args.dev_port.is_none();
    let dev = Device::start(dc).map_err(|e| e.to_string())?;
    let result = respond_on(tcp, &dev, &hello, peer_ip, secret, mode);
    dev.shutdown();
    result
}

fn respond_on(
    tcp: &mut TcpStream,
    dev: &Device,
    hello: &Hello<serde_json::Value>,
    peer_ip: IpAddr,
    secret: Option<[u8; 32]>,
    mode: &str,
) -> Result<(), String> {
    let cm_err = |e: cm::CmError| format!("connection manager: {e}");
    let suite = SocketAddr::new(peer_ip, hello.endpoint.device_port);
    let (qpns, mr, session_id) = dev
        .with(|ctx, _| -> Result<_, metaroce_verbs::VerbsError> {
            ctx.set_peer_session(suite, hello.endpoint.session_id)?;
            let pd = ctx.alloc_pd();
            let mr = ctx.reg_mr(pd, REGION_BYTES, AccessFlags(0xf))?;
            let cq = ctx.create_cq(4096)?;
            let init = QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                cap: QpCaps {
                    max_send_wr: 256,
                    max_recv_wr: 256,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
            };
            let mut qpns = Vec::new();
            for &remote in &hello.endpoint.qpns[..MIN_QPS] {
                let qp = ctx.create_qp(pd, &init)?;
                for attr in [
                    QpAttr {
                        qp_state: Some(QpState::Init),
                        qp_access_flags: Some(AccessFlags(0xf)),
                        port_num: Some(1),
                        ..QpAttr::default()
                    },
                    QpAttr {
                        qp_state: Some(QpState::Rtr),
                        dest_addr: Some(suite),
                        dest_qp_num: Some(remote),
                        path_mtu: Some(hello.endpoint.mtu.clamp(256, 4096)),
                        ..QpAttr::default()
                    },
                    QpAttr {
                        qp_state: Some(QpState::Rts),
                        timeout: Some(14),
                        retry_cnt: Some(7),
                        rnr_retry: Some(7),
                        ..QpAttr::default()
                    },
                ] {
                    ctx.modify_qp(qp, &attr)?;
                }
                qpns.push(qp.qp_num());
            }
            Ok((qpns, mr, ctx.session_id()))
        })
        .map_err(|e| e.to_string())?;
    let mut accept = Endpoint {
        device_port: dev.addr().port(),
        path_port_span: EndpointConfig::default().path_port_span,
        mtu: 4096,
        qpns,
        buf: RemoteBuf {
            addr: mr.addr,
            rkey: mr.rkey,
            len: mr.length,
        },
        session_id,
        auth: mode.into(),
        // The responder verifies every ICRC the suite sends (and its bad
        // ones): never agree to leave it out.
        icrc_omission: false,
        key_confirm: None,
        setup_grant_mbps: None,
    };
    let confirmation = secret.map(|s| {
        let at = |role| KeyConfirmation::new(&s, role, hello.endpoint.session_id, session_id, mode);
        (at(Role::Server), at(Role::Client))
    });
    if let Some((server, _)) = &confirmation {
        accept.key_confirm = Some(server.to_hex());
    }
    cm::send(tcp, MsgType::Accept, &accept).map_err(cm_err)?;
    if let Some((_, client)) = &confirmation {
        let c: Confirm = cm::recv(tcp, MsgType::Confirm).map_err(cm_err)?;
        client
            .verify(Some(&c.key_confirm))
            .map_err(|e| format!("{e} (METAROCE_JOB_SECRET must be the same on both sides)"))?;
    }
    // The suite drives the device over UDP; the engine thread answers.
    // A run takes seconds; an hour without Done is a suite that died.
    tcp.set_read_timeout(Some(Duration::from_secs(3600)))
        .map_err(|e| e.to_string())?;
    let _: serde_json::Value = cm::recv(tcp, MsgType::Done).map_err(cm_err)?;
    let counters: serde_json::Map<String, serde_json::Value> = dev
        .counters()
        .lines()
        .into_iter()
        .map(|(k, v)| (k, v.into()))
        .collect();
    cm::send(
        tcp,
        MsgType::Report,
        &serde_json::json!({ "counters": counters }),
    )
    .map_err(cm_err)?;
    Ok(())
}
