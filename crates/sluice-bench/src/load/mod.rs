//! The load: [`gen`] (the BPF live-frames generator), [`gencheck`] (its
//! accuracy), [`workers`] (its thread and the reply receiver in namespace
//! A), [`send`] (`sluice-bench send`: a paced sender over sockets).
pub mod gen;
pub mod gencheck;
pub mod send;
pub mod workers;
