//! MetaRoCE real UDP datapath (work in progress).
