//! MetaRoCE packet-level fabric simulator (work in progress).
