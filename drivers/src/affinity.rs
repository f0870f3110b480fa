//! CPU lists and pinning the calling thread to one CPU: an engine thread busy-polls its queue
//! on a core of its own, as a DPDK lcore does.

/// Parses a CPU list as the kernel and EAL's `-l` write it: `3`, `3,5`, `2-5`, `0,4-6`.
pub fn parse_cpu_list(list: &str) -> Result<Vec<usize>, String> {
    let bad = || format!("'{list}' is not a CPU list (e.g. 3,4 or 2-5)");
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let lo: usize = lo.trim().parse().map_err(|_| bad())?;
        let hi: usize = hi.trim().parse().map_err(|_| bad())?;
        if lo > hi || hi >= libc::CPU_SETSIZE as usize {
            return Err(bad());
        }
        cpus.extend(lo..=hi);
    }
    Ok(cpus)
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it (cpu is below
    // CPU_SETSIZE); sched_setaffinity reads `size_of` bytes of it for thread 0, the caller.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_eal_writes_them() {
        assert_eq!(parse_cpu_list("3").unwrap(), [3]);
        assert_eq!(parse_cpu_list("0,4-6").unwrap(), [0, 4, 5, 6]);
        for bad in ["", "x", "5-3", "1,,2", "-1", "99999"] {
            assert!(
                parse_cpu_list(bad).unwrap_err().contains("CPU list"),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_thread_pinned_to_a_cpu_runs_only_there() {
        let cpu = std::thread::spawn(|| {
            pin_current_thread(0).unwrap();
            // SAFETY: plain query of the calling thread's CPU.
            unsafe { libc::sched_getcpu() }
        })
        .join()
        .unwrap();
        assert_eq!(cpu, 0);
        assert!(pin_current_thread(usize::MAX).is_err());
    }
}
