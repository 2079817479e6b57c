//! The control channel: each rank's TCP connection to the root, kept open
//! after the bootstrap, through which failures reach every rank and the
//! job ends in step.
//!
//! A rank whose collective fails (a QP error, retries exhausted toward a
//! dead peer, a protocol violation) reports it to the root, and the root
//! tells every other rank; a rank whose connection to the root closes
//! without saying goodbye has died, and the root tells the others that
//! too. A rank that loses the root gives up as well. Every rank's watcher
//! thread records the reason, and the rank's waiting loop, which wakes at
//! least every [`ABORT_POLL`], ends the pending operation with it: a dead
//! rank ends the job with an error naming it, never a hang — even on
//! ranks that only wait to receive from it and would never notice through
//! their own QPs.
//!
//! The end is a handshake so that no rank closes its device while a peer
//! still has a write toward it in flight (a late credit would otherwise
//! exhaust its retries and fail a healthy rank): each rank drains its own
//! writes, says `bye`, and waits; the root answers every rank with
//! `release` once all of them have said it.

use metaroce_cm::{self as cm, CmError, MsgType};
use serde::{Deserialize, Serialize};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The longest a waiting rank sleeps before looking for an abort.
pub(crate) const ABORT_POLL: Duration = Duration::from_millis(50);

/// The body of the small control messages (`Done` from a rank: `ready`,
/// `bye`; `Report` from the root: `go`, `release`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Stage {
    pub(crate) stage: String,
}

impl Stage {
    pub(crate) fn new(stage: &str) -> Self {
        Self {
            stage: stage.to_owned(),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    abort: Option<String>,
    /// Root: which ranks said bye. Member: `[released]`.
    done: Vec<bool>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the first reason; true when this call set it.
    fn set_abort(&self, reason: String) -> bool {
        let mut st = self.lock();
        let first = st.abort.is_none();
        if first {
            st.abort = Some(reason);
        }
        self.changed.notify_all();
        first
    }
}

type Writers = Arc<Vec<Option<Mutex<TcpStream>>>>;

/// One rank's end of the control channel.
#[derive(Debug)]
pub(crate) struct Control {
    shared: Arc<Shared>,
    role: Role,
    finished: bool,
}

#[derive(Debug)]
enum Role {
    /// A world of one.
    Alone,
    /// Rank 0: a writer per member rank (by rank; `None` at 0).
    Root { writers: Writers },
    /// Any other rank: the connection to the root.
    Member { writer: Mutex<TcpStream> },
}

/// A control-channel failure in words (a closed connection says so).
fn why(e: &CmError) -> String {
    match e {
        CmError::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            "the connection closed".into()
        }
        other => other.to_string(),
    }
}

fn send_quiet<T: Serialize>(w: &Mutex<TcpStream>, ty: MsgType, body: &T) {
    let mut s = w.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ = cm::send(&mut *s, ty, body);
}

/// Root: record `reason` and tell every rank but `except`.
fn abort_all(shared: &Shared, writers: &Writers, except: Option<usize>, reason: String) {
    if !shared.set_abort(reason.clone()) {
        return;
    }
    broadcast_abort(writers, except, &reason);
}

fn broadcast_abort(writers: &Writers, except: Option<usize>, reason: &str) {
    for (k, w) in writers.iter().enumerate() {
        if let Some(w) = w
            && Some(k) != except
        {
            send_quiet(w, MsgType::Error, &reason.to_owned());
        }
    }
}

impl Control {
    /// The control channel of a world of one.
    pub(crate) fn alone() -> Self {
        Self {
            shared: Arc::default(),
            role: Role::Alone,
            finished: false,
        }
    }

    /// Rank 0 with its connections to ranks `1..` (index = rank, 0 unused);
    /// starts one watcher thread per rank.
    pub(crate) fn root(streams: Vec<Option<TcpStream>>) -> std::io::Result<Self> {
        let world = streams.len();
        let shared = Arc::new(Shared::default());
        shared.lock().done = vec![false; world];
        let mut readers = Vec::with_capacity(world);
        let mut writers = Vec::with_capacity(world);
        for s in streams {
            match s {
                Some(s) => {
                    s.set_read_timeout(None)?;
                    readers.push(Some(s.try_clone()?));
                    writers.push(Some(Mutex::new(s)));
                }
                None => {
                    readers.push(None);
                    writers.push(None);
                }
            }
        }
        let writers: Writers = Arc::new(writers);
        for (k, r) in readers.into_iter().enumerate() {
            let Some(mut r) = r else { continue };
            let (shared, writers) = (Arc::clone(&shared), Arc::clone(&writers));
            std::thread::Builder::new()
                .name(format!("coll-root-watch-{k}"))
                .spawn(move || {
                    loop {
                        match cm::recv::<Stage>(&mut r, MsgType::Done) {
                            Ok(s) if s.stage == "bye" => {
                                shared.lock().done[k] = true;
                                shared.changed.notify_all();
                            }
                            Ok(_) => {}
                            Err(CmError::Refused(msg)) => {
                                abort_all(&shared, &writers, Some(k), msg);
                            }
                            Err(e) => {
                                if !shared.lock().done[k] {
                                    abort_all(
                                        &shared,
                                        &writers,
                                        Some(k),
                                        format!(
                                            "rank {k} left the job before finishing (its connection to the root ended: {})",
                                            why(&e)
                                        ),
                                    );
                                }
                                return;
                            }
                        }
                    }
                })?;
        }
        Ok(Self {
            shared,
            role: Role::Root { writers },
            finished: false,
        })
    }

    /// A rank other than 0 with its connection to the root; starts the
    /// watcher thread.
    pub(crate) fn member(rank: u32, stream: TcpStream) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        shared.lock().done = vec![false];
        stream.set_read_timeout(None)?;
        let mut r = stream.try_clone()?;
        let watcher = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("coll-watch-{rank}"))
            .spawn(move || {
                loop {
                    match cm::recv::<Stage>(&mut r, MsgType::Report) {
                        Ok(s) if s.stage == "release" => {
                            watcher.lock().done[0] = true;
                            watcher.changed.notify_all();
                            return;
                        }
                        Ok(_) => {}
                        Err(CmError::Refused(msg)) => {
                            watcher.set_abort(msg);
                        }
                        Err(e) => {
                            if !watcher.lock().done[0] {
                                watcher.set_abort(format!(
                                    "lost contact with the root (rank 0): {}",
                                    why(&e)
                                ));
                            }
                            return;
                        }
                    }
                }
            })?;
        Ok(Self {
            shared,
            role: Role::Member {
                writer: Mutex::new(stream),
            },
            finished: false,
        })
    }

    /// Why the job was aborted, if it was.
    pub(crate) fn aborted(&self) -> Option<String> {
        self.shared.lock().abort.clone()
    }

    /// This rank failed: tell the others (through the root).
    pub(crate) fn report_failure(&self, reason: &str) {
        self.shared.set_abort(reason.to_owned());
        match &self.role {
            Role::Alone => {}
            Role::Root { writers } => broadcast_abort(writers, None, reason),
            Role::Member { writer } => {
                send_quiet(writer, MsgType::Error, &reason.to_owned());
            }
        }
    }

    /// The end handshake (see the module docs), waiting at most `timeout`
    /// for the other ranks. Returns the abort reason if the job was
    /// aborted first.
    pub(crate) fn finish(&mut self, timeout: Duration) -> Result<(), String> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        let deadline = Instant::now() + timeout;
        match &self.role {
            Role::Alone => Ok(()),
            Role::Member { writer } => {
                send_quiet(writer, MsgType::Done, &Stage::new("bye"));
                let r = self.wait(deadline, |st| st.done[0]);
                let s = writer
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let _ = s.shutdown(Shutdown::Both);
                r
            }
            Role::Root { writers } => {
                self.shared.lock().done[0] = true;
                let r = self.wait(deadline, |st| st.done.iter().all(|&d| d));
                for w in writers.iter().flatten() {
                    send_quiet(w, MsgType::Report, &Stage::new("release"));
                }
                r
            }
        }
    }

    fn wait(&self, deadline: Instant, done: impl Fn(&State) -> bool) -> Result<(), String> {
        let mut st = self.shared.lock();
        loop {
            if done(&st) {
                return Ok(());
            }
            if let Some(why) = &st.abort {
                return Err(why.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("timed out waiting for the other ranks to finish".into());
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}
