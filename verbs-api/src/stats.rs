//! The counters file `ferroce stats` reads: one per process and device.

use crate::device::Device;
use ferroce_stack::transport::Counters;

/// Writes `dev`'s counters (see `Context::export_stats`).
pub(crate) fn export(dev: &Device) -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::var_os("FERROCE_STATS_DIR").map_or_else(
        || std::path::PathBuf::from("/tmp/ferroce-stats"),
        Into::into,
    );
    std::fs::create_dir_all(&dir)?;
    let name: String = dev
        .name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let path = dir.join(format!("{}-{name}.stats", std::process::id()));
    let mut text = format!("pid={}\ndevice={}\n", std::process::id(), dev.name);
    for (k, v) in dev.counters().iter() {
        text.push_str(&format!("port.{k}={v}\n"));
    }
    let live = dev.qp_counters_all();
    for (qpn, c) in &live {
        for (k, v) in c.iter() {
            text.push_str(&format!("qp.{qpn:#x}.{k}={v}\n"));
        }
    }
    // QPs destroyed lately, with their last counters.
    let retired: Vec<(u32, Counters)> = {
        let r = dev.retired.lock().unwrap_or_else(|p| p.into_inner());
        r.iter().copied().collect()
    };
    let mut written: std::collections::HashSet<u32> = live.iter().map(|x| x.0).collect();
    for (qpn, c) in retired.iter().rev() {
        // The newest counters of a number first; a number a live QP has again is the live
        // QP's.
        if !written.insert(*qpn) {
            continue;
        }
        text.push_str(&format!("qp.{qpn:#x}.destroyed=1\n"));
        for (k, v) in c.iter() {
            text.push_str(&format!("qp.{qpn:#x}.{k}={v}\n"));
        }
    }
    // Native failover, for QPs with an alternate path: where each is, how often it moved.
    for slot in dev.engines.iter() {
        for (qpn, port, moves, ctl) in slot.lock().core().qp_paths_all() {
            text.push_str(&format!(
                "qp.{qpn:#x}.path_active_port={}\nqp.{qpn:#x}.path_migrations={moves}\n",
                port + 1
            ));
            for (k, v) in ctl.iter() {
                text.push_str(&format!("qp.{qpn:#x}.{k}={v}\n"));
            }
        }
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    // Forget exports of processes that are gone (all but the newest few), so the
    // directory does not grow without bound.
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut stale: Vec<_> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let pid = name.split('-').next()?.parse::<u32>().ok()?;
                let gone = !std::path::Path::new(&format!("/proc/{pid}")).exists();
                let modified = e.metadata().and_then(|m| m.modified()).ok()?;
                gone.then_some((modified, e.path()))
            })
            .collect();
        stale.sort();
        let excess = stale.len().saturating_sub(8);
        for (_, p) in stale.into_iter().take(excess) {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(path)
}
