//! RDMA WRITE between two processes (or two hosts) over real UDP, with
//! the connection manager's TCP side channel (`metaroce-cm`) to exchange
//! what each side needs: device port, QP number, buffer address and rkey.
//!
//! ```sh
//! cargo run -p metaroce-udp --example write -- server            # on host A
//! cargo run -p metaroce-udp --example write -- client HOST_A     # on host B
//! ```
//!
//! (`--port P` on both picks the TCP port, default 18600.) The client
//! writes 4 MiB into the server's buffer and tells the server it is done;
//! the server checks the bytes and answers whether they are intact.

mod common;
use common::{Side, run};
use metaroce_cm::{self as cm, Endpoint, Hello, MsgType, RemoteBuf};
use metaroce_verbs::{AccessFlags, SendWr, WrOp};
use serde::{Deserialize, Serialize};
use std::error::Error;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};

const LEN: u64 = 4 << 20;
const ACCESS: AccessFlags = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);

/// What the client asks for (the `params` of its Hello).
#[derive(Serialize, Deserialize)]
struct Request {
    len: u64,
}

/// Client → server when the WRITE completed.
#[derive(Serialize, Deserialize)]
struct Done {
    written: u64,
}

/// Server → client: what the server found in its buffer.
#[derive(Serialize, Deserialize)]
struct Verdict {
    intact: bool,
}

/// A device on `ip` (the address the peer reaches this host at) with one
/// QP in INIT and a `LEN`-byte buffer.
fn open(ip: IpAddr) -> Result<Side, Box<dyn Error>> {
    common::open_on(ip, metaroce_udp::os_seed(), LEN, ACCESS)
}

/// This side as the connection manager describes it to the peer.
fn describe(side: &Side) -> Endpoint {
    Endpoint {
        device_port: side.dev.addr().port(),
        path_port_span: 64,
        mtu: 4096,
        qpns: vec![side.qp.qp_num()],
        buf: RemoteBuf {
            addr: side.mr.addr,
            rkey: side.mr.rkey,
            len: side.mr.length,
        },
        session_id: side.dev.with(|ctx, _| ctx.session_id()),
        auth: "none".into(),
        key_confirm: None,
        setup_grant_mbps: None,
        // This device checks every ICRC (it does not offer to omit it).
        icrc_omission: false,
    }
}

/// Move `side`'s QP to RTR toward the peer's device (at `peer_ip`, the
/// other end of the TCP connection), then to RTS.
fn connect(side: &Side, peer_ip: IpAddr, peer: &Endpoint) -> Result<(), Box<dyn Error>> {
    let dest = SocketAddr::new(peer_ip, peer.device_port);
    side.dev
        .with(|ctx, _now| ctx.set_peer_session(dest, peer.session_id))?;
    common::connect_to(side, dest, peer.qpns[0], peer.mtu.min(4096))
}

fn pattern(i: usize) -> u8 {
    (i % 253) as u8
}

fn server(port: u16) -> Result<(), Box<dyn Error>> {
    let listener = TcpListener::bind(("0.0.0.0", port))?;
    println!("waiting for a client on TCP port {port}");
    let (mut tcp, _) = listener.accept()?;
    let hello: Hello<Request> = cm::recv(&mut tcp, MsgType::Hello)?;
    if hello.test != "write" || hello.params.len > LEN {
        cm::send(
            &mut tcp,
            MsgType::Error,
            &"this server takes one WRITE of at most 4 MiB",
        )?;
        return Err("unexpected request".into());
    }
    // Bind the device to the address the client reached us at.
    let side = open(tcp.local_addr()?.ip())?;
    connect(&side, tcp.peer_addr()?.ip(), &hello.endpoint)?;
    // Connected before Accept, so the client's first packet finds the QP.
    cm::send(&mut tcp, MsgType::Accept, &describe(&side))?;
    let done: Done = cm::recv(&mut tcp, MsgType::Done)?;
    let intact = side.dev.with(|ctx, _| {
        let bytes = &ctx.mr_bytes(&side.mr)[..done.written as usize];
        bytes.iter().enumerate().all(|(i, &b)| b == pattern(i))
    });
    cm::send(&mut tcp, MsgType::Report, &Verdict { intact })?;
    println!(
        "{} B written by {} into {}: {}",
        done.written,
        tcp.peer_addr()?,
        side.dev.addr(),
        if intact { "intact" } else { "CORRUPT" }
    );
    Ok(())
}

fn client(host: &str, port: u16) -> Result<(), Box<dyn Error>> {
    let mut tcp = TcpStream::connect((host, port))?;
    let side = open(tcp.local_addr()?.ip())?;
    side.dev.with(|ctx, _| {
        for (i, byte) in ctx.mr_bytes_mut(&side.mr).iter_mut().enumerate() {
            *byte = pattern(i);
        }
    });
    let hello = Hello {
        test: "write".into(),
        params: Request { len: LEN },
        endpoint: describe(&side),
        last: true,
    };
    cm::send(&mut tcp, MsgType::Hello, &hello)?;
    let server: Endpoint = cm::recv(&mut tcp, MsgType::Accept)?;
    connect(&side, tcp.peer_addr()?.ip(), &server)?;
    let write = SendWr::new(
        1,
        WrOp::Write {
            remote_addr: server.buf.addr,
            rkey: server.buf.rkey,
        },
        vec![side.mr.sge(0, LEN as u32)],
    );
    run(&side, write, "WRITE")?;
    cm::send(&mut tcp, MsgType::Done, &Done { written: LEN })?;
    let verdict: Verdict = cm::recv(&mut tcp, MsgType::Report)?;
    println!(
        "wrote {LEN} B to {}: the server found them {}",
        SocketAddr::new(tcp.peer_addr()?.ip(), server.device_port),
        if verdict.intact { "intact" } else { "CORRUPT" }
    );
    if verdict.intact {
        Ok(())
    } else {
        Err("the server's bytes differ".into())
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let port = match args.iter().position(|a| a == "--port") {
        Some(i) => args.get(i + 1).ok_or("--port needs a number")?.parse()?,
        None => 18600,
    };
    match args.first().map(String::as_str) {
        Some("server") => server(port),
        Some("client") => client(args.get(1).ok_or("client needs the server's host")?, port),
        _ => Err("usage: write server [--port P] | write client HOST [--port P]".into()),
    }
}
