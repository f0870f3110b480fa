//! Devices opened from a specification string, as `FERROCE_DEVICES`, `ferroce perf --device`
//! and the libibverbs drop-in name them: `afpacket:IFACE [gso]`, `tap:NAME[@IP]`, `loop[:IP]` and (with the
//! `dpdk` feature) `dpdk:EAL ARGS @IP [options]`. Each driver's options are parsed here, in one
//! place; the simulated fabric's devices come from [`SimNet`](crate::sim::SimNet) instead.

use std::io::{BufWriter, Write};
use std::net::IpAddr;

use ferroce_drivers::pcap::{Direction, PcapTee};

use crate::device::Device;
use crate::verbs::{Context, VerbsError};

/// Opens a device from its specification: `afpacket:IFACE [gso]` (a Linux interface through
/// an AF_PACKET socket; `gso` sends runs of data packets as one segmented datagram, see
/// [`AfPacketOptions`](ferroce_drivers::afpacket::AfPacketOptions)) or `tap:NAME[@IP]` (the far end of a TAP interface, with ferroce's own
/// address on it); both need root. `loop[:IP]` is a port with a loopback plug (no root, no
/// network: its QPs reach each other by the port's own GID, through the engine's
/// loopback; IP defaults to 10.0.9.1). `sim` devices come in pairs from
/// [`SimNet::pair`].
pub fn open_device(spec: &str) -> Result<Context, VerbsError> {
    open_device_with_pcap(spec, None)
}

/// [`open_device`], recording the port's traffic both ways to `pcap` when given.
pub fn open_device_with_pcap(
    spec: &str,
    pcap: Option<Box<dyn Write + Send>>,
) -> Result<Context, VerbsError> {
    fn device<P: ferroce_drivers::Port + Send + 'static>(
        spec: &str,
        port: P,
        ip: IpAddr,
        seed: u64,
        pcap: Option<Box<dyn Write + Send>>,
        control: Option<ferroce_drivers::control::tcp::ControlHandle>,
    ) -> Result<Context, VerbsError> {
        let dev = match pcap {
            Some(sink) => {
                let tee = PcapTee::new(port, BufWriter::new(sink), Direction::Both)
                    .map_err(|e| VerbsError::Open(format!("cannot write the pcap: {e}")))?;
                Device::new(spec.into(), tee, ip, seed, None)
            }
            None => Device::new(spec.into(), port, ip, seed, None),
        };
        if let Some(c) = control {
            let _ = dev.control.set(c);
        }
        dev.join_loopback();
        Ok(Context { dev })
    }
    match spec.split_once(':') {
        Some(("afpacket", rest)) if !rest.trim().is_empty() => {
            let mut words = rest.split_whitespace();
            let ifaces = words.next().unwrap_or_default();
            let mut opts = ferroce_drivers::afpacket::AfPacketOptions::default();
            for w in words {
                match w {
                    "gso" => opts.gso = true,
                    _ => {
                        return Err(VerbsError::Open(format!(
                            "unknown option '{w}' in {spec}; afpacket:IFACE takes only gso"
                        )))
                    }
                }
            }
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            let mut ports = Vec::new();
            let mut ips = Vec::new();
            for iface in ifaces.split(',') {
                let port = ferroce_drivers::afpacket::AfPacketPort::open_with(iface, opts)
                    .map_err(|e| VerbsError::Open(e.to_string()))?;
                ips.push(port.ip().ok_or_else(|| {
                    VerbsError::Open(format!(
                        "interface {iface} has no IP address; RoCEv2 needs one for its GID (ip addr add ... dev {iface})"
                    ))
                })?);
                ports.push(port);
            }
            if ports.len() == 1 {
                let port = ports.pop().expect("one port");
                return device(spec, port, ips[0], seed, pcap, None);
            }
            // Several interfaces: one device with a port on each (native failover between
            // them); a capture records port 1.
            if pcap.is_some() {
                return Err(VerbsError::Open(format!(
                    "{spec}: a capture of a multi-port device is not supported; capture one interface"
                )));
            }
            let dev = Device::multi_port(spec.into(), ports, ips, seed, None);
            dev.join_loopback();
            Ok(Context { dev })
        }
        _ if spec == "loop" || spec.starts_with("loop:") => {
            let ip = match spec.strip_prefix("loop:") {
                Some(ip) => ip.parse::<IpAddr>().map_err(|_| {
                    VerbsError::Open(format!("'{ip}' in {spec} is not an IP address"))
                })?,
                None => IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 9, 1)),
            };
            device(spec, ferroce_drivers::pipe::plug(1500), ip, 0x100b, pcap, None)
        }
        Some(("tap", rest)) if !rest.is_empty() => {
            let (name, ip) = match rest.split_once('@') {
                Some((n, ip)) => {
                    let ip = ip.parse::<IpAddr>().map_err(|_| {
                        VerbsError::Open(format!("'{ip}' in {spec} is not an IP address"))
                    })?;
                    (n, Some(ip))
                }
                None => (rest, None),
            };
            let port = ferroce_drivers::tap::TapPort::open(name, ip)
                .map_err(|e| VerbsError::Open(e.to_string()))?;
            let ip = port.ip();
            device(spec, port, ip, 0x7a9, pcap, None)
        }
        #[cfg(feature = "dpdk")]
        Some(("dpdk", rest)) => {
            let d = DpdkSpec::parse(spec, rest)?;
            ferroce_drivers::dpdk::eal_init(d.eal).map_err(|e| VerbsError::Open(e.to_string()))?;
            let zero_copy = d.zero_copy.then_some(ferroce_drivers::dpdk::ZERO_COPY_MIN);
            dpdk_device(spec, &d, zero_copy, pcap)
        }
        _ => Err(VerbsError::Open(format!(
            "unknown device '{spec}'; use sim, afpacket:IFACE[ gso] (e.g. afpacket:veth0), tap:NAME[@IP], loop[:IP]{}",
            if cfg!(feature = "dpdk") { " or dpdk:EAL ARGS @IP [port=N] [queues=N] [cores=LIST] [desc=N] [zerocopy] [isolate] [control=smoltcp|kernel]" } else { " (dpdk: needs the dpdk feature)" }
        ))),
    }
}

/// A `dpdk:` device: `dpdk:EAL ARGS @IP [port=N] [queues=N] [cores=LIST] [desc=N] [zerocopy] [isolate] [control=smoltcp|kernel]`.
/// EAL arguments pass through verbatim; after ` @` come the port's RoCEv2 address (DPDK
/// ports have none of their own) and options: which probed port (default 0; several `dpdk:`
/// devices in one process name the same EAL arguments and different ports), how many
/// queue pairs, each with an engine of its own (default 1), the CPUs the engine threads are
/// pinned to (one per queue, in order), flow isolation with rules that
/// steer UDP 4791 to those queues (a bifurcated NIC; implies control=kernel), ring depth
/// (default 1024), zero-copy transmit of payloads from registered memory, and who answers
/// for the address: smoltcp on the port (default; ARP, ping, the out-of-band TCP) or the
/// kernel (a bifurcated NIC whose flow rule sends only UDP 4791 to DPDK).
#[cfg_attr(not(feature = "dpdk"), allow(dead_code))]
#[derive(Debug, PartialEq)]
struct DpdkSpec<'a> {
    eal: &'a str,
    ip: IpAddr,
    port: u16,
    /// A multi-port device (`@IP1,IP2 port=0,1`): every port and its address, port 1
    /// first (`ip` and `port` are port 1's). One entry for a one-port device.
    ips: Vec<IpAddr>,
    ports: Vec<u16>,
    queues: u16,
    desc: u16,
    zero_copy: bool,
    kernel_control: bool,
    isolate: bool,
    cores: Vec<usize>,
}

#[cfg_attr(not(feature = "dpdk"), allow(dead_code))]
impl<'a> DpdkSpec<'a> {
    fn parse(spec: &str, rest: &'a str) -> Result<Self, VerbsError> {
        let bad = |what: String| VerbsError::Open(format!("{spec}: {what}"));
        let Some((eal, tail)) = rest.rsplit_once(" @") else {
            return Err(bad(
                "end it with ' @IP', the port's RoCEv2 address (e.g. ' @10.0.0.1')".into(),
            ));
        };
        let mut words = tail.split_whitespace();
        let ips = words
            .next()
            .unwrap_or("")
            .split(',')
            .map(|ip| {
                ip.parse::<IpAddr>()
                    .map_err(|_| bad(format!("'{ip}' is not an IP address")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ip = ips[0];
        let mut d = Self {
            eal,
            ip,
            port: 0,
            ips,
            ports: vec![0],
            queues: 1,
            desc: 1024,
            zero_copy: false,
            kernel_control: false,
            isolate: false,
            cores: Vec::new(),
        };
        let mut smoltcp_asked = false;
        for w in words {
            let num = |v: &str| {
                v.parse::<u16>()
                    .map_err(|_| bad(format!("'{w}' needs a number from 0 to 65535")))
            };
            match w.split_once('=') {
                Some(("port", v)) => {
                    d.ports = v.split(',').map(num).collect::<Result<Vec<_>, _>>()?;
                    d.port = d.ports[0];
                }
                Some(("desc", v)) => d.desc = num(v)?.max(64),
                Some(("queues", v)) => {
                    d.queues = num(v)?;
                    if d.queues == 0 {
                        return Err(bad("queues=0: a device needs at least one queue".into()));
                    }
                }
                None if w == "zerocopy" => d.zero_copy = true,
                Some(("control", "smoltcp")) => smoltcp_asked = true,
                Some(("control", "kernel")) => d.kernel_control = true,
                None if w == "isolate" => d.isolate = true,
                Some(("cores", v)) => {
                    d.cores = ferroce_drivers::affinity::parse_cpu_list(v).map_err(&bad)?;
                }
                _ => {
                    return Err(bad(format!(
                        "unknown option '{w}' after the address (port=N, queues=N, cores=LIST, desc=N, zerocopy, isolate, control=smoltcp|kernel)"
                    )))
                }
            }
        }
        if d.isolate {
            if smoltcp_asked {
                return Err(bad(
                    "isolate leaves everything but RoCEv2 to the kernel, so smoltcp would see nothing; use control=kernel".into(),
                ));
            }
            d.kernel_control = true;
        }
        if smoltcp_asked && d.kernel_control {
            return Err(bad("control= given twice".into()));
        }
        if d.ports.len() != d.ips.len() {
            return Err(bad(format!(
                "{} ports and {} addresses: give one address per port (@IP1,IP2 port=0,1)",
                d.ports.len(),
                d.ips.len()
            )));
        }
        if d.ports.len() > 1 && d.queues > 1 {
            return Err(bad(
                "a device with several ports runs one queue on each (queues=1)".into(),
            ));
        }
        if !d.cores.is_empty() && d.cores.len() < usize::from(d.queues) {
            return Err(bad(format!(
                "cores= names {} CPUs for {} queues; name one per queue",
                d.cores.len(),
                d.queues
            )));
        }
        Ok(d)
    }

    /// Opens the port as the options say: one handle per queue.
    #[cfg(feature = "dpdk")]
    fn open(
        &self,
        zero_copy_min: Option<usize>,
    ) -> Result<Vec<ferroce_drivers::dpdk::DpdkPort>, ferroce_drivers::dpdk::DpdkError> {
        self.open_port(self.port, zero_copy_min)
    }

    /// Opens port `port` as the options say: one handle per queue.
    #[cfg(feature = "dpdk")]
    fn open_port(
        &self,
        port: u16,
        zero_copy_min: Option<usize>,
    ) -> Result<Vec<ferroce_drivers::dpdk::DpdkPort>, ferroce_drivers::dpdk::DpdkError> {
        ferroce_drivers::dpdk::DpdkPort::open_config(
            port,
            &ferroce_drivers::dpdk::PortConfig {
                queues: self.queues,
                rx_desc: self.desc,
                tx_desc: self.desc,
                zero_copy_min,
                isolate: self.isolate,
            },
        )
    }
}

/// A `dpdk:` device: the port opened with `queues=N` queue pairs (default 1) and an engine
/// on each. No kernel serves the port unless `control=kernel` (a bifurcated NIC, mlx5: the
/// kernel keeps the address and everything but RoCE), so smoltcp on the first queue answers
/// ARP and ping for the address and carries the out-of-band TCP; the other queues pass it
/// the control frames receive-side scaling gives them. A capture records every queue into
/// one file.
#[cfg(feature = "dpdk")]
fn dpdk_device(
    spec: &str,
    d: &DpdkSpec<'_>,
    zero_copy: Option<usize>,
    pcap: Option<Box<dyn Write + Send>>,
) -> Result<Context, VerbsError> {
    use crate::device::boxed_engine;
    use crate::slot::DeviceEngine;
    use ferroce_drivers::pcap::SharedCapture;
    // One capture file for the port: each queue's tee adds its records to it.
    let capture = match pcap {
        Some(sink) => Some(
            SharedCapture::new(Box::new(BufWriter::new(sink)))
                .map_err(|e| VerbsError::Open(format!("cannot write the pcap: {e}")))?,
        ),
        None => None,
    };
    fn engine<P: ferroce_drivers::Port + Send + 'static>(
        port: P,
        capture: Option<&SharedCapture>,
        seed: u64,
    ) -> Result<Box<dyn DeviceEngine>, VerbsError> {
        Ok(match capture {
            Some(c) => boxed_engine(
                PcapTee::new(port, c.sink(), Direction::Both)
                    .map_err(|e| VerbsError::Open(format!("cannot write the pcap: {e}")))?,
                seed,
                true,
            ),
            None => boxed_engine(port, seed, true),
        })
    }
    if d.ports.len() > 1 {
        return dpdk_multi_port(spec, d, zero_copy, capture.as_ref());
    }
    let ports = d
        .open(zero_copy)
        .map_err(|e| VerbsError::Open(e.to_string()))?;
    let seed = 0xd9d;
    let mut ports = ports.into_iter();
    let first = ports
        .next()
        .ok_or_else(|| VerbsError::Open(format!("{spec}: the port opened no queue")))?;
    let capture = capture.as_ref();
    let (engines, control) = if d.kernel_control {
        let engines = std::iter::once(first)
            .chain(ports)
            .map(|p| engine(p, capture, seed))
            .collect::<Result<Vec<_>, _>>()?;
        (engines, None)
    } else {
        let plane = ferroce_drivers::control::ControlPlane::new(first, d.ip);
        let control = plane.handle();
        let others = ports
            .map(|p| engine(plane.feed(p), capture, seed))
            .collect::<Result<Vec<_>, _>>()?;
        let mut engines = vec![engine(plane, capture, seed)?];
        engines.extend(others);
        (engines, Some(control))
    };
    let dev = Device::with_engines(spec.into(), engines, d.ip, seed, None);
    if let Some(c) = control {
        let _ = dev.control.set(c);
    }
    let _ = dev.cores.set(d.cores.clone());
    dev.join_loopback();
    Ok(Context { dev })
}

/// A `dpdk:` device with several ports (`@IP1,IP2 port=0,1`): one queue on each, one engine
/// over all (native failover between them), smoltcp answering on each port for its own
/// address unless `control=kernel` (the out-of-band TCP goes through port 1).
#[cfg(feature = "dpdk")]
fn dpdk_multi_port(
    spec: &str,
    d: &DpdkSpec<'_>,
    zero_copy: Option<usize>,
    capture: Option<&ferroce_drivers::pcap::SharedCapture>,
) -> Result<Context, VerbsError> {
    use ferroce_drivers::pcap::SharedCapture;
    fn device<P: ferroce_drivers::Port + Send + 'static>(
        spec: &str,
        ports: Vec<P>,
        ips: Vec<IpAddr>,
        capture: Option<&SharedCapture>,
    ) -> Result<std::sync::Arc<Device>, VerbsError> {
        let seed = 0xd9d;
        Ok(match capture {
            Some(c) => {
                let tees = ports
                    .into_iter()
                    .map(|p| PcapTee::new(p, c.sink(), Direction::Both))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| VerbsError::Open(format!("cannot write the pcap: {e}")))?;
                Device::multi_port(spec.into(), tees, ips, seed, None)
            }
            None => Device::multi_port(spec.into(), ports, ips, seed, None),
        })
    }
    let mut opened = Vec::new();
    for &port in &d.ports {
        let mut queues = d
            .open_port(port, zero_copy)
            .map_err(|e| VerbsError::Open(e.to_string()))?;
        opened.push(
            queues
                .pop()
                .ok_or_else(|| VerbsError::Open(format!("{spec}: port {port} opened no queue")))?,
        );
    }
    let dev = if d.kernel_control {
        device(spec, opened, d.ips.clone(), capture)?
    } else {
        let planes: Vec<_> = opened
            .into_iter()
            .zip(&d.ips)
            .map(|(p, &ip)| ferroce_drivers::control::ControlPlane::new(p, ip))
            .collect();
        let control = planes[0].handle();
        let dev = device(spec, planes, d.ips.clone(), capture)?;
        let _ = dev.control.set(control);
        dev
    };
    let _ = dev.cores.set(d.cores.clone());
    dev.join_loopback();
    Ok(Context { dev })
}

/// The devices named by `FERROCE_DEVICES` (comma-separated specifications), or `sim`.
pub fn device_list() -> Vec<String> {
    match std::env::var("FERROCE_DEVICES") {
        Ok(v) if !v.trim().is_empty() => split_devices(&v),
        _ => vec!["sim".into()],
    }
}

/// Splits a `FERROCE_DEVICES` value at the commas that start a new device (a driver name
/// and a colon, or `sim`): a comma inside one device's specification — between the
/// interfaces of a multi-port `afpacket:veth0,veth1`, in DPDK's EAL arguments — stays.
fn split_devices(v: &str) -> Vec<String> {
    let starts = |s: &str| {
        let s = s.trim_start();
        ["afpacket:", "tap:", "dpdk:"]
            .iter()
            .any(|p| s.starts_with(p))
            || s == "sim"
            || s.starts_with("sim:")
    };
    let mut out: Vec<String> = Vec::new();
    for piece in v.split(',') {
        match out.last_mut() {
            Some(last) if !starts(piece) => {
                last.push(',');
                last.push_str(piece);
            }
            _ => out.push(piece.to_owned()),
        }
    }
    out.into_iter().map(|s| s.trim().to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::{split_devices, DpdkSpec};

    #[test]
    fn a_device_list_splits_only_where_a_device_starts() {
        assert_eq!(
            split_devices("afpacket:veth0,veth1 gso, tap:t0@10.0.0.1,sim"),
            ["afpacket:veth0,veth1 gso", "tap:t0@10.0.0.1", "sim"]
        );
        assert_eq!(
            split_devices("dpdk:-l 1 --vdev=net_memif0,role=server @10.0.0.1,afpacket:eth0"),
            [
                "dpdk:-l 1 --vdev=net_memif0,role=server @10.0.0.1",
                "afpacket:eth0"
            ]
        );
    }

    #[test]
    fn dpdk_specs_parse_address_and_options() {
        let s = "dpdk:-l 1 --vdev=net_memif0,role=server @10.0.0.1 port=1 queues=4 cores=2,4-6 desc=512 zerocopy control=kernel";
        let d = DpdkSpec::parse(s, &s[5..]).unwrap();
        assert_eq!(d.eal, "-l 1 --vdev=net_memif0,role=server");
        assert_eq!(d.ip, "10.0.0.1".parse::<std::net::IpAddr>().unwrap());
        assert_eq!(
            (d.port, d.queues, d.desc, d.zero_copy, d.kernel_control),
            (1, 4, 512, true, true)
        );
        assert_eq!(d.cores, [2, 4, 5, 6]);
        let d = DpdkSpec::parse("x", "-l 0 @fd00::1").unwrap();
        assert_eq!(
            (d.port, d.queues, d.desc, d.zero_copy, d.kernel_control),
            (0, 1, 1024, false, false)
        );
        assert!(!d.isolate);
        let d = DpdkSpec::parse("x", "-l 0 @10.0.0.1,10.0.1.1 port=0,1").unwrap();
        assert_eq!((d.ports, d.ips.len(), d.port), (vec![0, 1], 2, 0));
        // Isolation leaves ARP and TCP to the kernel.
        let d = DpdkSpec::parse("x", "-l 0 @10.0.0.1 isolate queues=2").unwrap();
        assert!(d.isolate && d.kernel_control);
        for bad in [
            "-l 0",
            "-l 0 @nope",
            "-l 0 @10.0.0.1 port=x",
            "-l 0 @10.0.0.1 fast",
            "-l 0 @10.0.0.1 control=bgp",
            "-l 0 @10.0.0.1 queues=0",
            "-l 0 @10.0.0.1 isolate control=smoltcp",
            "-l 0 @10.0.0.1 control=smoltcp control=kernel",
            "-l 0 @10.0.0.1 queues=2 cores=3",
            "-l 0 @10.0.0.1 cores=3-x",
            "-l 0 @10.0.0.1 port=0,1",
            "-l 0 @10.0.0.1,10.0.1.1 port=0,1 queues=2",
        ] {
            let e = DpdkSpec::parse("dpdk:", bad).unwrap_err().to_string();
            assert!(e.contains("dpdk:"), "{e}");
        }
    }
}
