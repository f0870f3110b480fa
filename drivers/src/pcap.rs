//! A pcap tee for any port: standard pcap (LINKTYPE_ETHERNET) with nanosecond timestamps
//! from the port's own clock, so a simulated run gives a byte-identical file per seed.

use std::io::Write;
use std::time::Duration;

use ferroce_stack::transport::SplitFrame;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};

use crate::{Port, TxError};

/// Which direction a tee records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Frames received and sent.
    Both,
    /// Frames received only.
    Rx,
    /// Frames sent only.
    Tx,
}

/// Opens a pcap writer with ferroce's header: nanosecond resolution, Ethernet link type,
/// little-endian, 65535-byte snap length.
pub fn writer<W: Write>(sink: W) -> Result<PcapWriter<W>, pcap_file::PcapError> {
    let header = PcapHeader {
        version_major: 2,
        version_minor: 4,
        ts_correction: 0,
        ts_accuracy: 0,
        snaplen: 65535,
        datalink: DataLink::ETHERNET,
        ts_resolution: TsResolution::NanoSecond,
        endianness: Endianness::Little,
    };
    PcapWriter::with_header(sink, header)
}

/// Appends one frame stamped `ts_ns` to a pcap writer.
pub fn write_frame<W: Write>(
    w: &mut PcapWriter<W>,
    ts_ns: u64,
    frame: &[u8],
) -> Result<(), pcap_file::PcapError> {
    let packet = PcapPacket::new(Duration::from_nanos(ts_ns), frame.len() as u32, frame);
    w.write_packet(&packet).map(|_| ())
}

/// Wraps a port and records its traffic. Write errors do not disturb the data path; the
/// first one is kept and reported by [`PcapTee::finish`].
pub struct PcapTee<P, W: Write> {
    inner: P,
    writer: PcapWriter<W>,
    direction: Direction,
    error: Option<pcap_file::PcapError>,
    frames: u64,
    /// A split frame assembled for the capture.
    scratch: Vec<u8>,
}

impl<P: Port, W: Write> PcapTee<P, W> {
    /// Starts recording `inner` into `sink` (a file, a `Vec<u8>`, ...).
    pub fn new(inner: P, sink: W, direction: Direction) -> Result<Self, pcap_file::PcapError> {
        Ok(Self {
            inner,
            writer: writer(sink)?,
            direction,
            error: None,
            frames: 0,
            scratch: Vec::new(),
        })
    }

    /// The wrapped port.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The wrapped port, mutably.
    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }

    /// Frames recorded so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Stops recording and returns the port and the sink, or the first write error.
    pub fn finish(self) -> Result<(P, W), pcap_file::PcapError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok((self.inner, self.writer.into_writer())),
        }
    }

    fn record(
        writer: &mut PcapWriter<W>,
        error: &mut Option<pcap_file::PcapError>,
        frames: &mut u64,
        ts: u64,
        frame: &[u8],
    ) {
        if error.is_some() {
            return;
        }
        match write_frame(writer, ts, frame) {
            Ok(()) => *frames += 1,
            Err(e) => *error = Some(e),
        }
    }
}

impl<P: Port, W: Write> Port for PcapTee<P, W> {
    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        let ts = self.inner.now_ns();
        let on = self.direction != Direction::Tx;
        let (writer, error, frames) = (&mut self.writer, &mut self.error, &mut self.frames);
        self.inner.rx_burst(max, |frame| {
            if on {
                Self::record(writer, error, frames, ts, frame);
            }
            f(frame)
        })
    }

    fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError> {
        let ts = self.inner.now_ns();
        let on = self.direction != Direction::Rx;
        let (writer, error, frames) = (&mut self.writer, &mut self.error, &mut self.frames);
        self.inner.tx(len, |buf| {
            fill(buf);
            if on {
                Self::record(writer, error, frames, ts, buf);
            }
        })
    }

    fn tx_split(&mut self, head: &[u8], frame: &SplitFrame<'_>) -> Result<(), TxError> {
        if self.direction != Direction::Rx && self.error.is_none() {
            let ts = self.inner.now_ns();
            let mut copy = std::mem::take(&mut self.scratch);
            copy.resize(frame.len(), 0);
            frame.copy_to(head, &mut copy);
            Self::record(
                &mut self.writer,
                &mut self.error,
                &mut self.frames,
                ts,
                &copy,
            );
            self.scratch = copy;
        }
        self.inner.tx_split(head, frame)
    }

    crate::port::forward_to_inner!();
}
