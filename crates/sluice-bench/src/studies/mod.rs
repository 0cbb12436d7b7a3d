//! One study each: [`readers`] (`--scenario readers`: a service's readers,
//! the shared-socket study), [`cpu`] (`--scenario cpu`: two services on one
//! CPU, the priority-receive study), [`echo`] (their paced echo client),
//! [`capture`] (`bench capture`: the capture-cost study's experiment, with
//! the gate), [`demo`] (the daemon in action), [`gate_cost`] (the gate's ns
//! per packet), [`tick_cost`] (the daemon's loop, read by read),
//! [`trace_cost`] (what `sluice trace` costs the service it watches),
//! [`idle`] (what an idle daemon costs: `sluice run` with nothing to do).
pub mod capture;
pub mod cpu;
pub mod demo;
pub mod echo;
pub mod gate_cost;
pub mod idle;
pub mod readers;
pub mod tick_cost;
pub mod trace_cost;
