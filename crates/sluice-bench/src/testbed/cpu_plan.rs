//! The bench's CPU plan: the CPU that runs the flood's generator (and,
//! unless told otherwise, the legitimate clients) and the CPU that runs the
//! service, chosen once from the CPUs this process may run on and the cores
//! they belong to. Every testbed takes its two CPUs from here, and the dns,
//! http and sources runs write them into results.json. On the 2-CPU
//! reference VM the plan is CPU 0 and CPU 1, as the bench always ran.
//!
//! The service runs on another core than the generator where there is one:
//! an SMT sibling shares its core's execution units, so the service's cost
//! would move with the flood's. It is the lowest such CPU in the
//! generator's package (the same memory node).
//!
//! Not here yet (issue 51, item 4): several generator workers, control
//! CPUs, and a multi-queue veth with the flood and the clients on chosen
//! queues. On veth the gate runs on the sender's CPU, so `--clients-cpu`
//! already puts the clients on another queue than the flood.
use std::sync::OnceLock;

/// A CPU this process may run on, and where it sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpu {
    pub id: usize,
    pub package: u32,
    pub core: u32,
}

/// The generator's CPU and the service's (a run records them, with the
/// clients', as `services::CpuPlan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub generator: usize,
    pub service: usize,
}

/// The generator on the first CPU; the service on the first CPU of another
/// core, in the generator's package if it has one, else on any other CPU.
/// None with fewer than two CPUs.
pub fn choose(cpus: &[Cpu]) -> Option<Plan> {
    let first = *cpus.iter().min_by_key(|c| c.id)?;
    let other = |keep: &dyn Fn(&Cpu) -> bool| cpus.iter().filter(|c| c.id != first.id && keep(c)).map(|c| c.id).min();
    let service = other(&|c| c.package == first.package && c.core != first.core)
        .or_else(|| other(&|c| (c.package, c.core) != (first.package, first.core)))
        .or_else(|| other(&|_| true))?;
    Some(Plan { generator: first.id, service })
}

/// This machine's plan, read once: the CPUs of this process's affinity
/// mask, each with its package and core from sysfs (a CPU whose topology
/// cannot be read counts as a core of its own). With fewer than two CPUs,
/// CPU 0 and CPU 1: the bench's own checks then say it needs two.
pub fn here() -> Plan {
    static PLAN: OnceLock<Plan> = OnceLock::new();
    *PLAN.get_or_init(|| choose(&allowed_cpus()).unwrap_or(Plan { generator: 0, service: 1 }))
}

fn allowed_cpus() -> Vec<Cpu> {
    let read = |cpu: usize, what: &str| -> Option<u32> {
        let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}");
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    };
    sluice::base::netns::affinity(0)
        .into_iter()
        .map(|cpu| Cpu {
            id: cpu,
            package: read(cpu, "physical_package_id").unwrap_or(0),
            core: read(cpu, "core_id").map_or(u32::MAX - cpu as u32, |c| c),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(layout: &[(usize, u32, u32)]) -> Vec<Cpu> {
        layout.iter().map(|&(id, package, core)| Cpu { id, package, core }).collect()
    }

    #[test]
    fn two_cpus_are_the_generator_and_the_service() {
        let plan = choose(&cpus(&[(0, 0, 0), (1, 0, 1)])).unwrap();
        assert_eq!(plan, Plan { generator: 0, service: 1 });
        assert_eq!(choose(&cpus(&[(0, 0, 0)])), None, "one CPU: no plan");
    }

    #[test]
    fn the_service_is_on_another_core_in_the_generators_package() {
        // Linux numbers SMT siblings apart: 0 and 8 share a core here.
        let mut layout: Vec<(usize, u32, u32)> = (0..16).map(|c| (c, (c % 8 / 4) as u32, (c % 4) as u32)).collect();
        let plan = choose(&cpus(&layout)).unwrap();
        assert_eq!(plan, Plan { generator: 0, service: 1 });
        // Siblings numbered side by side (0 and 1 share a core): not CPU 1.
        layout = (0..8).map(|c| (c, 0, (c / 2) as u32)).collect();
        assert_eq!(choose(&cpus(&layout)).unwrap(), Plan { generator: 0, service: 2 });
        // Only another package has another core: there.
        layout = vec![(2, 0, 0), (3, 0, 0), (4, 1, 0)];
        assert_eq!(choose(&cpus(&layout)).unwrap(), Plan { generator: 2, service: 4 });
        // Two siblings of one core: the other sibling, better than nothing.
        layout = vec![(0, 0, 0), (1, 0, 0)];
        assert_eq!(choose(&cpus(&layout)).unwrap(), Plan { generator: 0, service: 1 });
    }

    #[test]
    fn this_machine_has_a_plan_of_two_cpus() {
        let plan = here();
        assert_ne!(plan.generator, plan.service);
    }
}
