//! Engine threads: one per engine of a device, each turning its engine until told to stop,
//! pinned to a CPU when the device names cores. The first engine's thread of a multi-engine
//! device also evens the engines' load now and then (`Device::rebalance`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::device::Device;
use crate::error::VerbsError;

/// Hands `dev`'s loop to engine threads (see `Context::start_engine_thread`).
pub(crate) fn start(dev: &Arc<Device>) -> Result<(), VerbsError> {
    if dev.sim.is_some() {
        return Err(VerbsError::Open(
            "a simulated device runs on its caller's thread; use progress()".into(),
        ));
    }
    let mut slot = dev.thread.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_some() {
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let cores = dev.cores.get().cloned().unwrap_or_default();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    let mut failed = None;
    for index in 0..dev.engines.len() {
        let dev = dev.clone();
        let flag = stop.clone();
        let name = match dev.engines.len() {
            1 => format!("ferroce-engine-{}", dev.name),
            _ => format!("ferroce-engine-{}-q{index}", dev.name),
        };
        let cpu = cores.get(index).copied();
        let ready = ready_tx.clone();
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            if let Some(cpu) = cpu {
                if let Err(e) = ferroce_drivers::affinity::pin_current_thread(cpu) {
                    let _ = ready.send(Err(format!(
                        "cannot pin the engine thread of queue {index} to CPU {cpu}: {e}"
                    )));
                    return;
                }
            }
            let _ = ready.send(Ok(()));
            let slot = &dev.engines[index];
            slot.lock().port_mut().thread_started();
            let mut every: Box<dyn FnMut()> = if index == 0 && dev.engines.len() > 1 {
                let mut next = std::time::Instant::now();
                let dev = dev.clone();
                Box::new(move || {
                    let Some(interval) = dev.balance_interval() else {
                        return;
                    };
                    let now = std::time::Instant::now();
                    if now >= next {
                        next = now + interval;
                        dev.rebalance();
                    }
                })
            } else {
                Box::new(|| {})
            };
            slot.run(&flag, dev.engines.len() > 1, &mut *every);
            slot.lock().port_mut().thread_stopped();
        });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                failed = Some(format!("cannot spawn the engine thread: {e}"));
                break;
            }
        }
    }
    drop(ready_tx);
    for _ in 0..handles.len() {
        match ready.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Err(_) => failed = failed.or(Some("an engine thread died at start".into())),
        }
    }
    if let Some(e) = failed {
        stop.store(true, Ordering::Release);
        for h in handles {
            let _ = h.join();
        }
        return Err(VerbsError::Open(e));
    }
    dev.threaded.store(true, Ordering::Release);
    *slot = Some((stop, handles));
    Ok(())
}

/// Stops `dev`'s engine threads, if they run.
pub(crate) fn stop(dev: &Device) {
    let taken = dev.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some((stop, handles)) = taken {
        stop.store(true, Ordering::Release);
        for slot in dev.engines.iter() {
            slot.idle.wake_always();
        }
        for h in handles {
            let _ = h.join();
        }
        dev.threaded.store(false, Ordering::Release);
    }
}
