//! Quotas: the limits a server announces on its answers ([`announced`]), read as they are.

pub mod announced;
