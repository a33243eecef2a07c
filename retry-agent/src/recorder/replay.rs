//! The replay driver: feeds recorded events through the live stages (one code path: the live
//! pipeline can drive the same struct).
