//! The bench's CPU plan: which CPUs run the flood's generator workers (and,
//! unless told otherwise, the legitimate clients), which runs the service,
//! and which runs the bench's control (the daemon and the rig's tick),
//! chosen once from the CPUs this process may run on and the cores they
//! belong to. Every testbed takes its CPUs from here, and the dns, http and
//! sources runs write them into results.json. On the 2-CPU reference VM the
//! plan is CPU 0 (generator, clients, control unpinned) and CPU 1 (service),
//! as the bench always ran.
//!
//! The service runs on another core than the generator where there is one:
//! an SMT sibling shares its core's execution units, so the service's cost
//! would move with the flood's. It is the lowest such CPU in the
//! generator's package (the same memory node). The control takes a core of
//! its own where a third is left, so the daemon under test is not timed by
//! the flood's CPUs; the generator workers take one CPU of every other core.
//!
//! The veth pair has a queue per CPU (`Testbed`'s `queues`), and a sender's
//! queue is its CPU's, as RSS gives each flow a queue: the flood's workers
//! and the clients enter on the queues of the CPUs they run on.
use std::sync::OnceLock;

/// A CPU this process may run on, and where it sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpu {
    pub id: usize,
    pub package: u32,
    pub core: u32,
}

/// Where each part of a run goes (a run records it, with the clients' CPU
/// and the queues, as `services::CpuPlan`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Every CPU a generator worker may take, the first generator CPU
    /// (`generator`) first; never empty.
    pub generators: Vec<usize>,
    pub service: usize,
    /// The control's CPU; None where no third core is left (the daemon then
    /// runs where the scheduler puts it, the rig's tick on `generator`).
    pub control: Option<usize>,
}

impl Plan {
    /// The first generator CPU: the one worker of the benches that pace
    /// their own legitimate stream, and the clients' CPU unless told.
    pub fn generator(&self) -> usize {
        self.generators[0]
    }
}

/// CPUs as "0" or "0,3,4".
pub fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// The generator on the first CPU; the service on the first CPU of another
/// core, in the generator's package if it has one, else on any other CPU;
/// the control on the first CPU of a third core, likewise; one more
/// generator worker on the first CPU of each core left. None with fewer
/// than two CPUs.
pub fn choose(cpus: &[Cpu]) -> Option<Plan> {
    let first = *cpus.iter().min_by_key(|c| c.id)?;
    let core = |c: &Cpu| (c.package, c.core);
    let mut taken = vec![core(&first)];
    // The lowest CPU not on a taken core, in the generator's package first.
    let pick = |taken: &[(u32, u32)]| {
        let free = |c: &&Cpu| !taken.contains(&core(c));
        let near = cpus.iter().filter(free).filter(|c| c.package == first.package).map(|c| c.id).min();
        near.or_else(|| cpus.iter().filter(free).map(|c| c.id).min())
    };
    let service = pick(&taken).or_else(|| cpus.iter().map(|c| c.id).filter(|&id| id != first.id).min())?;
    taken.extend(cpus.iter().filter(|c| c.id == service).map(core));
    let control = pick(&taken);
    taken.extend(cpus.iter().filter(|c| Some(c.id) == control).map(core));
    let mut generators = vec![first.id];
    let mut rest: Vec<&Cpu> = cpus.iter().filter(|c| !taken.contains(&core(c))).collect();
    rest.sort_by_key(|c| c.id);
    for c in rest {
        if !taken.contains(&core(c)) {
            taken.push(core(c));
            generators.push(c.id);
        }
    }
    Some(Plan { generators, service, control })
}

/// This machine's plan, read once: the CPUs of this process's affinity
/// mask, each with its package and core from sysfs (a CPU whose topology
/// cannot be read counts as a core of its own). With fewer than two CPUs,
/// CPU 0 and CPU 1: the bench's own checks then say it needs two.
pub fn here() -> &'static Plan {
    static PLAN: OnceLock<Plan> = OnceLock::new();
    PLAN.get_or_init(|| choose(&allowed_cpus()).unwrap_or(Plan { generators: vec![0], service: 1, control: None }))
}

/// A queue per CPU this process may run on: one more than the highest.
pub fn queues() -> u32 {
    sluice::base::netns::affinity(0).into_iter().map(|cpu| cpu as u32 + 1).max().unwrap_or(1).max(2)
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

    fn plan(generators: &[usize], service: usize, control: Option<usize>) -> Plan {
        Plan { generators: generators.to_vec(), service, control }
    }

    #[test]
    fn two_cpus_are_the_generator_and_the_service() {
        let plan = choose(&cpus(&[(0, 0, 0), (1, 0, 1)])).unwrap();
        assert_eq!(plan, self::plan(&[0], 1, None), "no third core: no control CPU");
        assert_eq!(choose(&cpus(&[(0, 0, 0)])), None, "one CPU: no plan");
        let four = choose(&cpus(&[(0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 0, 3)])).unwrap();
        assert_eq!(four, self::plan(&[0, 3], 1, Some(2)), "a third core controls, a fourth generates");
    }

    #[test]
    fn each_part_takes_a_core_of_its_own_in_the_generators_package_first() {
        // Linux numbers SMT siblings apart: 0 and 8 share a core here, and
        // CPUs 4-7 (and 12-15) are a second package.
        let mut layout: Vec<(usize, u32, u32)> = (0..16).map(|c| (c, (c % 8 / 4) as u32, (c % 4) as u32)).collect();
        let plan = choose(&cpus(&layout)).unwrap();
        assert_eq!(plan, self::plan(&[0, 3, 4, 5, 6, 7], 1, Some(2)), "one worker a core, no sibling");
        // Siblings numbered side by side (0 and 1 share a core): not CPU 1.
        layout = (0..8).map(|c| (c, 0, (c / 2) as u32)).collect();
        assert_eq!(choose(&cpus(&layout)).unwrap(), self::plan(&[0, 6], 2, Some(4)));
        // Only another package has another core: there, and no control.
        layout = vec![(2, 0, 0), (3, 0, 0), (4, 1, 0)];
        assert_eq!(choose(&cpus(&layout)).unwrap(), self::plan(&[2], 4, None));
        // Two siblings of one core: the other sibling, better than nothing.
        layout = vec![(0, 0, 0), (1, 0, 0)];
        assert_eq!(choose(&cpus(&layout)).unwrap(), self::plan(&[0], 1, None));
    }

    #[test]
    fn no_cpu_has_two_parts() {
        let layout: Vec<(usize, u32, u32)> = (0..64).map(|c| (c, (c / 32) as u32, (c % 16) as u32)).collect();
        let plan = choose(&cpus(&layout)).unwrap();
        let mut all: Vec<usize> = plan.generators.iter().copied().chain([plan.service]).chain(plan.control).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "{plan:?}");
        assert_eq!(n, 32, "one CPU of each of the 32 cores");
    }

    #[test]
    fn this_machine_has_a_plan_of_two_cpus() {
        let plan = here();
        assert_ne!(plan.generator(), plan.service);
        assert!(queues() as usize > plan.service.max(plan.generator()), "a queue for every CPU of the plan");
    }
}
