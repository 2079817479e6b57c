//! Structured `tracing` spans and events at the points worth seeing.
//!
//! Spans: one `conn` span per connection (fields `peer`, the peer device's
//! address, and `conn`, the connection's slot in the endpoint), open from
//! the connection's setup to its teardown, and inside it one `path` span
//! per sending path generation (`slot`, `gen`, `src_port`), open from the
//! path's first use to its retirement. A subscriber follows one connection
//! or one path by them (`RUST_LOG='[conn{peer=10.0.0.2:4793}]=debug'`) and
//! sees their lifetimes. The connection span takes the span current when
//! the connection is created as its parent: a driver running several
//! devices in one process can enter a span of its own around each device's
//! calls to tell them apart.
//!
//! Events, by level (each inside its connection's or path's span):
//! - `WARN`: a connection failed (retry count exceeded); the event names
//!   its `peer` itself, so it reads whole when the filter hides the spans;
//! - `INFO`: connection set up and torn down, a path retired for a fresh
//!   source port, a work request failed and its QP entering the error
//!   state;
//! - `DEBUG`: a path opened; packets declared lost by a SACK gap; a
//!   tail-loss probe sent; a path suspect (silent while others delivered
//!   later packets) and probed; a probe unanswered on a silent connection;
//!   a path failed (proved dead: retired without an RTO); a path's RTO,
//!   and its undoing when it proves spurious; a connection's retry
//!   timeout;
//! - `TRACE`: every retransmitted packet.
//!
//! Spans and events all have the target `metaroce_proto` (not their
//! module's path), so one filter directive names all of them:
//! `metaroce_proto=debug`, or a level alone.
//!
//! Events carry the caller's clock as `now_ns` where the core has it (in
//! the harness and the simulator it is virtual time, unlike a subscriber's
//! timestamp).
//!
//! Cost. Without the `trace` feature (on by default) all of this compiles
//! to nothing. With it and no subscriber, or one whose filter is off for
//! these levels, an event costs a load and compare of `tracing`'s global
//! maximum level; on the per-packet path there are only the resend and
//! SACK-loss events, each behind a branch taken for a resend or a loss. A
//! connection holds one pointer, empty unless a subscriber wanted its span
//! when it was set up (`benches/trace_cost.rs` measures it against a build
//! without the feature).
//!
//! The core keeps no global state for this: spans live in the connections,
//! and the only globals are `tracing`'s own (the dispatcher a driver
//! installs, and the macros' per-callsite caches).

/// `tracing::event!` when the `trace` feature is on, nothing otherwise.
///
/// `trace_event!(in: GUARD, LEVEL, fields.., "message")` first checks
/// `tracing`'s global maximum level (one load and compare: the whole cost
/// when nobody listens at that level), then evaluates `GUARD` (e.g.
/// [`ConnTrace::enter_path`], which enters the connection's and the path's
/// spans) and emits the event inside it. Entering, rather than naming the
/// span as the event's parent, is what lets a filter select by span
/// fields (`[conn{peer=..}]=debug`): `tracing-subscriber`'s `EnvFilter`
/// matches the spans a thread is in. The guard exits them right after.
/// Without `in:`, a plain event in whatever span the driver is in.
/// Arguments are not evaluated unless the level is on.
macro_rules! trace_event {
    (in: $enter:expr, $level:ident, $($rest:tt)+) => {
        #[cfg(feature = "trace")]
        if ::tracing::Level::$level <= ::tracing::level_filters::STATIC_MAX_LEVEL
            && ::tracing::Level::$level <= ::tracing::level_filters::LevelFilter::current()
        {
            let _entered = $enter;
            ::tracing::event!(target: "metaroce_proto", ::tracing::Level::$level, $($rest)+);
        }
    };
    ($level:ident, $($rest:tt)+) => {
        #[cfg(feature = "trace")]
        {
            ::tracing::event!(target: "metaroce_proto", ::tracing::Level::$level, $($rest)+);
        }
    };
}

pub(crate) use trace_event;

#[cfg(feature = "trace")]
pub(crate) use enabled::ConnTrace;

#[cfg(not(feature = "trace"))]
pub(crate) use disabled::ConnTrace;

#[cfg(feature = "trace")]
mod enabled {
    use std::net::SocketAddr;
    use tracing::Span;
    use tracing::span::Entered;

    /// A connection's spans: nothing (one null pointer) unless a subscriber
    /// was interested in the connection's span when it was set up.
    #[derive(Debug)]
    pub(crate) struct ConnTrace(Option<Box<Spans>>);

    #[derive(Debug)]
    struct Spans {
        conn: Span,
        /// By path slot: the current generation's span.
        paths: Vec<Span>,
    }

    /// Inside a connection's span (and one of its paths') until dropped.
    pub(crate) struct InSpans<'a> {
        // Exits first: the innermost span.
        _path: Option<Entered<'a>>,
        _conn: Entered<'a>,
    }

    impl ConnTrace {
        /// No spans (a closed slot, or before setup).
        pub(crate) fn none() -> Self {
            Self(None)
        }

        /// The span of a connection being set up (its parent: the span
        /// current at the time, if any).
        pub(crate) fn open(peer: SocketAddr, index: u32) -> Self {
            let conn = tracing::info_span!(target: "metaroce_proto", "conn", %peer, conn = index);
            if conn.is_disabled() {
                return Self(None);
            }
            Self(Some(Box::new(Spans {
                conn,
                paths: Vec::new(),
            })))
        }

        /// Path `slot` starts its generation `generation` on `src_port`:
        /// its span replaces (closes) the previous generation's.
        pub(crate) fn open_path(&mut self, slot: usize, generation: u16, src_port: u16) {
            let Some(s) = self.0.as_deref_mut() else {
                return;
            };
            // Inside the connection's span: a filter on its fields then
            // takes its paths too.
            let in_conn = s.conn.enter();
            let span = tracing::info_span!(
                target: "metaroce_proto",
                parent: &s.conn,
                "path",
                slot,
                gen = generation,
                src_port
            );
            drop(in_conn);
            if slot < s.paths.len() {
                s.paths[slot] = span;
            } else {
                s.paths.resize_with(slot, Span::none);
                s.paths.push(span);
            }
        }

        /// Enter the connection's span (nothing if it has none).
        pub(crate) fn enter(&self) -> Option<InSpans<'_>> {
            let s = self.0.as_deref()?;
            Some(InSpans {
                _conn: s.conn.enter(),
                _path: None,
            })
        }

        /// Enter the connection's span and path `slot`'s inside it.
        pub(crate) fn enter_path(&self, slot: usize) -> Option<InSpans<'_>> {
            let s = self.0.as_deref()?;
            let conn = s.conn.enter();
            Some(InSpans {
                _path: s.paths.get(slot).map(Span::enter),
                _conn: conn,
            })
        }

        /// Heap bytes held (zero unless a subscriber took the spans).
        pub(crate) fn memory_bytes(&self) -> usize {
            self.0.as_ref().map_or(0, |s| {
                size_of::<Spans>() + s.paths.capacity() * size_of::<Span>()
            })
        }
    }
}

#[cfg(not(feature = "trace"))]
mod disabled {
    use std::net::SocketAddr;

    /// Without the `trace` feature: no spans, no bytes.
    #[derive(Debug)]
    pub(crate) struct ConnTrace;

    impl ConnTrace {
        pub(crate) fn none() -> Self {
            Self
        }

        pub(crate) fn open(_peer: SocketAddr, _index: u32) -> Self {
            Self
        }

        pub(crate) fn open_path(&mut self, _slot: usize, _generation: u16, _src_port: u16) {}

        pub(crate) fn memory_bytes(&self) -> usize {
            0
        }
    }
}

#[cfg(all(test, feature = "trace"))]
mod tests {
    //! The spans and events a subscriber sees, recorded by a small
    //! subscriber of the tests' own (the core depends on `tracing` only).

    use super::ConnTrace;
    use crate::config::EndpointConfig;
    use crate::testing::fixture::{self, completions, lab};
    use crate::testing::{Fate, Side};
    use crate::transmit::PacketKind;
    use crate::work::{SendWr, WcStatus, WrOp};
    use std::collections::HashMap;
    use std::fmt::Write as _;
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    #[derive(Debug, Clone)]
    struct SpanRec {
        name: &'static str,
        fields: String,
        parent: Option<u64>,
        refs: usize,
        closed: bool,
    }

    #[derive(Debug, Clone)]
    struct EventRec {
        level: Level,
        message: String,
        fields: String,
        /// The spans it is in, innermost first, as `name{fields}`.
        scope: Vec<String>,
    }

    #[derive(Default)]
    struct Log {
        next_id: u64,
        spans: HashMap<u64, SpanRec>,
        events: Vec<EventRec>,
        /// Spans entered and not yet exited (one thread per recorder).
        entered: Vec<u64>,
    }

    /// Records everything at or above `max` (more verbose levels are
    /// greater in `tracing`'s order).
    #[derive(Clone)]
    struct Recorder {
        max: Level,
        log: Arc<Mutex<Log>>,
    }

    #[derive(Default)]
    struct Fields {
        message: String,
        rest: String,
    }

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.message = format!("{value:?}");
            } else {
                let _ = write!(self.rest, "{}={value:?} ", field.name());
            }
        }
    }

    impl Recorder {
        fn new(max: Level) -> Self {
            Self {
                max,
                log: Arc::default(),
            }
        }

        fn events(&self) -> Vec<EventRec> {
            self.log.lock().unwrap().events.clone()
        }

        /// Every span so far, with its id.
        fn spans(&self) -> Vec<(u64, SpanRec)> {
            let log = self.log.lock().unwrap();
            log.spans.iter().map(|(&id, s)| (id, s.clone())).collect()
        }
    }

    impl Subscriber for Recorder {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            metadata.target() == "metaroce_proto" && *metadata.level() <= self.max
        }

        fn new_span(&self, span: &Attributes<'_>) -> Id {
            let mut fields = Fields::default();
            span.record(&mut fields);
            let mut log = self.log.lock().unwrap();
            log.next_id += 1;
            let id = log.next_id;
            let rec = SpanRec {
                name: span.metadata().name(),
                fields: fields.rest.trim_end().to_owned(),
                parent: span.parent().map(Id::into_u64),
                refs: 1,
                closed: false,
            };
            log.spans.insert(id, rec);
            Id::from_u64(id)
        }

        fn record(&self, _: &Id, _: &Record<'_>) {}

        fn record_follows_from(&self, _: &Id, _: &Id) {}

        fn event(&self, event: &Event<'_>) {
            let mut fields = Fields::default();
            event.record(&mut fields);
            let mut log = self.log.lock().unwrap();
            let mut scope = Vec::new();
            let mut at = if event.is_contextual() {
                log.entered.last().copied()
            } else {
                event.parent().map(Id::into_u64)
            };
            while let Some(id) = at {
                let s = &log.spans[&id];
                scope.push(format!("{}{{{}}}", s.name, s.fields));
                at = s.parent;
            }
            log.events.push(EventRec {
                level: *event.metadata().level(),
                message: fields.message,
                fields: fields.rest,
                scope,
            });
        }

        fn enter(&self, id: &Id) {
            self.log.lock().unwrap().entered.push(id.into_u64());
        }

        fn exit(&self, id: &Id) {
            let mut log = self.log.lock().unwrap();
            let at = log.entered.iter().rposition(|&e| e == id.into_u64());
            log.entered.remove(at.expect("exit of an entered span"));
        }

        fn clone_span(&self, id: &Id) -> Id {
            self.log
                .lock()
                .unwrap()
                .spans
                .get_mut(&id.into_u64())
                .expect("known span")
                .refs += 1;
            id.clone()
        }

        fn try_close(&self, id: Id) -> bool {
            let mut log = self.log.lock().unwrap();
            let s = log.spans.get_mut(&id.into_u64()).expect("known span");
            s.refs -= 1;
            s.closed = s.refs == 0;
            s.closed
        }
    }

    fn find<'a>(events: &'a [EventRec], message: &str) -> Vec<&'a EventRec> {
        events
            .iter()
            .filter(|e| e.message.starts_with(message))
            .collect()
    }

    fn write(l: &mut fixture::Lab, wr_id: u64, len: u32) {
        let (a, b) = (l.a, l.b);
        let wr = SendWr::new(
            wr_id,
            WrOp::Write {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, len)],
        );
        l.pair.a.post_send(a.qp, wr).unwrap();
    }

    #[test]
    fn a_dead_route_shows_as_a_failover_and_a_retirement_in_the_paths_span() {
        let rec = Recorder::new(Level::TRACE);
        let (peer, dead, spans) = tracing::subscriber::with_default(rec.clone(), || {
            // As in the retirement test of `connection::timers`: slot 0's
            // route is broken while the other three deliver.
            let cfg = |seed| EndpointConfig {
                line_rate_bps: 10_000_000_000,
                ..fixture::config(seed)
            };
            let mut l = lab(cfg(1), cfg(2));
            let peer = l.pair.addr(Side::B);
            let dead = l.pair.a.path_ports(peer).unwrap()[0];
            l.pair.set_filter(Some(Box::new(move |hop| {
                if hop.transmit.kind == PacketKind::Data && hop.transmit.src_port == dead {
                    Fate::Drop
                } else {
                    Fate::Deliver
                }
            })));
            write(&mut l, 1, 64 << 10);
            assert!(l.pair.settle(10_000, 1_000));
            let wcs = completions(&mut l.pair, Side::A);
            assert_eq!(wcs[0].wc.status, WcStatus::Success);
            // While the connection lives (its spans close with it).
            (peer, dead, rec.spans())
        });
        let events = rec.events();
        let a_conn = format!("conn{{peer={peer} conn=0}}");
        let setup = find(&events, "connection set up");
        assert_eq!(setup.len(), 2, "one per side: {setup:?}");
        assert!(
            setup.iter().any(|e| e.scope == [a_conn.as_str()]),
            "{setup:?}"
        );
        assert!(setup.iter().all(|e| e.level == Level::INFO));
        // A's four paths opened in their spans, inside the connection's.
        let opened = find(&events, "path opened");
        for slot in 0..4 {
            let path = format!("path{{slot={slot} gen=0 src_port=");
            assert!(
                opened.iter().any(|e| e.scope.len() == 2
                    && e.scope[0].starts_with(&path)
                    && e.scope[1] == a_conn),
                "slot {slot}: {opened:?}"
            );
        }
        let slot0 = format!("path{{slot=0 gen=0 src_port={dead}}}");
        // Proved dead while the others delivered: failed over, no RTO.
        let failed = find(&events, "path failed");
        assert!(!failed.is_empty(), "no failover event: {events:?}");
        assert!(
            failed
                .iter()
                .all(|e| e.scope == [slot0.as_str(), a_conn.as_str()]),
            "{failed:?}"
        );
        assert!(failed[0].fields.contains("now_ns="), "{:?}", failed[0]);
        assert!(find(&events, "path RTO").is_empty());
        let retired = find(&events, "path retired");
        assert_eq!(retired.len(), 1, "{retired:?}");
        assert_eq!(retired[0].scope, [slot0.as_str(), a_conn.as_str()]);
        assert_eq!(retired[0].level, Level::INFO);
        assert!(
            retired[0].fields.contains("rtos_in_a_row=0"),
            "{:?}",
            retired[0]
        );
        // The slot's next generation opens its own span on the new port,
        // and the old generation's span is closed.
        let new_port: u16 = retired[0]
            .fields
            .split_whitespace()
            .find_map(|f| f.strip_prefix("new_src_port="))
            .and_then(|p| p.parse().ok())
            .expect("new_src_port field");
        assert_ne!(new_port, dead);
        let gen1 = format!("path{{slot=0 gen=1 src_port={new_port}}}");
        assert!(
            opened
                .iter()
                .any(|e| e.scope == [gen1.as_str(), a_conn.as_str()]),
            "{opened:?}"
        );
        let span = |fields: &str| {
            spans
                .iter()
                .map(|(_, s)| s)
                .find(|s| format!("{}{{{}}}", s.name, s.fields) == fields)
                .unwrap_or_else(|| panic!("no span {fields}"))
        };
        assert!(
            span(&slot0).closed,
            "the retired generation's span is closed"
        );
        assert!(!span(&gen1).closed);
        // Every packet of the dead route went again, each a TRACE event in
        // the path span it went out on.
        let resent = find(&events, "retransmit");
        assert!(!resent.is_empty());
        assert!(resent.iter().all(|e| e.level == Level::TRACE
            && e.scope.len() == 2
            && e.scope[0].starts_with("path{")
            && e.fields.contains("psn=")));
    }

    #[test]
    fn qp_error_and_teardown_close_the_connection_span() {
        let rec = Recorder::new(Level::INFO);
        let peer = tracing::subscriber::with_default(rec.clone(), || {
            let mut l = lab(fixture::config(1), fixture::config(2));
            let a = l.a;
            let peer = l.pair.addr(Side::B);
            // A failed request first: a bad rkey's NAK fails the WRITE.
            let wr = SendWr::new(
                7,
                WrOp::Write {
                    remote_addr: l.b.mr.addr,
                    rkey: l.b.mr.rkey ^ 1,
                },
                vec![a.sge(0, 64)],
            );
            l.pair.a.post_send(a.qp, wr).unwrap();
            assert!(l.pair.settle(1_000, 1_000));
            l.pair.a.set_qp_error(a.qp).unwrap();
            l.pair.a.destroy_qp(a.qp).unwrap();
            peer
        });
        let events = rec.events();
        let a_conn = format!("conn{{peer={peer} conn=0}}");
        let failed = find(&events, "work request failed");
        assert_eq!(failed.len(), 1, "{events:?}");
        assert_eq!(failed[0].scope, [a_conn.as_str()]);
        assert!(failed[0].fields.contains("wr_id=7"), "{:?}", failed[0]);
        assert!(failed[0].fields.contains("RemAccessErr"), "{:?}", failed[0]);
        // A's QP entered the error state once (set_qp_error again is no
        // news), and so did B's, whose responder refused the rkey.
        let qp_errors = find(&events, "QP error");
        assert_eq!(qp_errors.len(), 2, "{events:?}");
        assert!(qp_errors.iter().any(|e| e.scope == [a_conn.as_str()]));
        let down = find(&events, "connection torn down");
        assert_eq!(down.len(), 1);
        assert_eq!(down[0].scope, [a_conn.as_str()]);
        // Nothing below INFO was recorded, and the connection's span (with
        // its paths') closed with it.
        assert!(events.iter().all(|e| e.level <= Level::INFO));
        let spans = rec.spans();
        let (conn_id, conn) = spans
            .iter()
            .find(|(_, s)| s.name == "conn" && s.fields == format!("peer={peer} conn=0"))
            .expect("A's connection span");
        assert!(conn.closed);
        let paths: Vec<_> = spans
            .iter()
            .filter(|(_, s)| s.parent == Some(*conn_id))
            .collect();
        // A path's span opens with its first packet: the one WRITE used
        // some of the four.
        assert!((1..=4).contains(&paths.len()), "{spans:?}");
        assert!(paths.iter().all(|(_, s)| s.name == "path" && s.closed));
    }

    #[test]
    fn with_spans_filtered_out_a_failure_still_names_its_peer() {
        let rec = Recorder::new(Level::WARN);
        let peer = tracing::subscriber::with_default(rec.clone(), || {
            let cfg = EndpointConfig {
                retry_cnt: 1,
                ..fixture::config(1)
            };
            let mut l = lab(cfg, fixture::config(2));
            let peer = l.pair.addr(Side::B);
            // The peer is gone: nothing from A arrives.
            l.pair.set_filter(Some(Box::new(|hop| {
                if hop.from == Side::A {
                    Fate::Drop
                } else {
                    Fate::Deliver
                }
            })));
            write(&mut l, 1, 4096);
            assert!(l.pair.settle(100_000, 10_000));
            let wcs = completions(&mut l.pair, Side::A);
            assert_eq!(wcs[0].wc.status, WcStatus::RetryExcErr);
            peer
        });
        assert!(rec.spans().is_empty(), "INFO spans are off at WARN");
        let events = rec.events();
        let failed = find(&events, "connection failed");
        assert_eq!(failed.len(), 1, "{events:?}");
        assert!(failed[0].scope.is_empty());
        assert!(
            failed[0].fields.contains(&format!("peer={peer}")),
            "{:?}",
            failed[0]
        );
        assert!(events.iter().all(|e| e.level == Level::WARN));
    }

    #[test]
    fn without_a_subscriber_a_connection_holds_no_spans() {
        let peer = "10.0.0.2:4793".parse().unwrap();
        let mut t = ConnTrace::open(peer, 0);
        t.open_path(3, 0, 4794);
        assert_eq!(t.memory_bytes(), 0);
        assert!(t.enter().is_none() && t.enter_path(3).is_none());
        // With one, the spans are held (and counted).
        let rec = Recorder::new(Level::INFO);
        tracing::subscriber::with_default(rec.clone(), || {
            let mut t = ConnTrace::open(peer, 0);
            t.open_path(3, 0, 4794);
            assert!(t.memory_bytes() > 0);
            // Entering a path enters the connection too, and leaves both.
            let guard = t.enter_path(3);
            assert_eq!(rec.log.lock().unwrap().entered.len(), 2);
            drop(guard);
            assert!(rec.log.lock().unwrap().entered.is_empty());
            // Slots without a span of their own: just the connection's.
            let guard = t.enter_path(1);
            assert_eq!(rec.log.lock().unwrap().entered.len(), 1);
            drop(guard);
        });
    }

    #[test]
    fn timeouts_are_events_of_their_connection_or_path() {
        let rec = Recorder::new(Level::DEBUG);
        tracing::subscriber::with_default(rec.clone(), || {
            // An RTO far below the RTT on a clean wire: paths time out, and
            // the ACKs that come after all prove each RTO spurious.
            let cfg = |seed| EndpointConfig {
                line_rate_bps: 10_000_000_000,
                rto_min_ns: 1_000,
                ack_delay_ns: 5_000,
                tail_copy_packets: 0,
                ..fixture::config(seed)
            };
            let mut l = lab(cfg(1), cfg(2));
            for wr_id in 1..=4 {
                write(&mut l, wr_id, 64 << 10);
            }
            assert!(l.pair.settle(10_000, 1_000));
            let wcs = completions(&mut l.pair, Side::A);
            assert!(wcs.iter().all(|c| c.wc.status == WcStatus::Success));
            let s = *l.pair.a.stats();
            assert!(s.rtos + s.retry_timeouts > 0, "{s:?}");
        });
        let events = rec.events();
        let rtos = find(&events, "path RTO");
        let undone = find(&events, "RTO undone");
        // The connection's retry timer beats the paths' RTOs here (its
        // floor is the same microsecond, and packets whose segments were
        // settled elsewhere no longer time out): at least the retry is an
        // event of the connection; the path RTOs and undos, when they come,
        // are events of their path.
        let retries = find(&events, "connection retry timeout");
        assert!(!retries.is_empty(), "{events:?}");
        assert!(
            retries
                .iter()
                .all(|e| e.scope.len() == 1 && e.scope[0].starts_with("conn{")),
            "{retries:?}"
        );
        for e in rtos.iter().chain(&undone) {
            assert_eq!(e.level, Level::DEBUG);
            assert!(
                e.scope.len() == 2 && e.scope[0].starts_with("path{slot="),
                "{e:?}"
            );
            assert!(e.fields.contains("now_ns="), "{e:?}");
        }
        assert!(rtos.iter().all(|e| e.fields.contains("in_a_row=")));
        // Each undone RTO is one its path had.
        assert!(
            undone
                .iter()
                .all(|u| rtos.iter().any(|r| r.scope == u.scope)),
            "{undone:?} {rtos:?}"
        );
        // What a connection timer gave up on and the ACKs undid is logged
        // as that, in its path's scope.
        for e in find(&events, "give-up undone") {
            assert!(
                e.scope.len() == 2 && e.scope[0].starts_with("path{slot="),
                "{e:?}"
            );
        }
    }
}
