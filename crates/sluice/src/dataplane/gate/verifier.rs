//! What the kernel's verifier spent on each of the gate's programs when it
//! loaded them: the instructions it processed (the kernel refuses a
//! program past BPF_COMPLEXITY_LIMIT_INSNS, one million) and the stack of
//! each function (the frames of one call chain share MAX_BPF_STACK, 512
//! bytes). A change to the gate that takes it near either fails to load on
//! some kernel, so `sluice bench gate` prints them and a test asserts the
//! room left (`tests/gate_packets.rs`).
use std::sync::Mutex;

use libbpf_rs::PrintLevel;

use super::{Gate, Result};

/// The kernel's limits (include/linux/bpf.h).
pub const INSN_LIMIT: u64 = 1_000_000;
pub const STACK_LIMIT: u32 = 512;

/// One program's cost to the verifier.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VerifierCost {
    pub program: String,
    /// Instructions the verifier processed (its walk over every path).
    pub insns: u64,
    /// Bytes of stack of the program and of each function it calls, in
    /// the verifier's order ("stack depth 320+192+16").
    pub stack: Vec<u32>,
}

/// libbpf's messages while `verifier_costs` loads the gate.
static LOG: Mutex<String> = Mutex::new(String::new());

fn capture(_: PrintLevel, msg: String) {
    LOG.lock().unwrap_or_else(|e| e.into_inner()).push_str(&msg);
}

/// Load the gate once with the verifier's statistics on and read them.
/// libbpf's print callback is the process's: it is taken for the load and
/// given back after.
pub fn verifier_costs() -> Result<Vec<VerifierCost>> {
    LOG.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let before = libbpf_rs::set_print(Some((PrintLevel::Debug, capture)));
    let loaded = Gate::load_logged(1024, 0, 4);
    libbpf_rs::set_print(before);
    drop(loaded?);
    Ok(parse(&LOG.lock().unwrap_or_else(|e| e.into_inner())))
}

/// The costs in libbpf's log of successful loads: each program's
/// "prog 'NAME': -- BEGIN PROG LOAD LOG --" block, with its "stack depth
/// A+B+..." and "processed N insns" lines. A program whose block lacks
/// either is left out.
pub fn parse(log: &str) -> Vec<VerifierCost> {
    let mut costs = Vec::new();
    for block in log.split("prog '").skip(1) {
        let Some((program, rest)) = block.split_once('\'') else { continue };
        if !rest.contains("BEGIN PROG LOAD LOG") {
            continue;
        }
        let line = |key: &str| rest.lines().find_map(|l| l.trim().strip_prefix(key).map(str::to_string));
        let insns = line("processed ").and_then(|l| l.split_whitespace().next().and_then(|n| n.parse().ok()));
        let stack = line("stack depth ")
            .map(|l| l.split('+').map(|n| n.trim().parse::<u32>()).collect::<std::result::Result<Vec<_>, _>>());
        if let (Some(insns), Some(Ok(stack))) = (insns, stack) {
            costs.push(VerifierCost { program: program.to_string(), insns, stack });
        }
    }
    costs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_programs_block_gives_its_insns_and_frames() {
        let log = "libbpf: prog 'sluice_gate': -- BEGIN PROG LOAD LOG --\nverification time 594697 usec\n\
                   stack depth 320+192+16+184\nprocessed 384563 insns (limit 1000000) max_states_per_insn 24\n\
                   -- END PROG LOAD LOG --\nlibbpf: prog 'sluice_learn': -- BEGIN PROG LOAD LOG --\n\
                   stack depth 120\nprocessed 13129 insns (limit 1000000)\n-- END PROG LOAD LOG --\n\
                   libbpf: prog 'broken': -- BEGIN PROG LOAD LOG --\nstack depth x+1\nprocessed 5 insns\n";
        let costs = parse(log);
        assert_eq!(
            costs,
            vec![
                VerifierCost { program: "sluice_gate".into(), insns: 384_563, stack: vec![320, 192, 16, 184] },
                VerifierCost { program: "sluice_learn".into(), insns: 13_129, stack: vec![120] },
            ],
            "a block whose stack line does not parse is left out"
        );
    }
}
