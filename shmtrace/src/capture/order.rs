//! Kernel-time ordering across rings and CPUs. Events are read from two
//! rings, each filled by several CPUs, so they arrive slightly out of
//! order; an event is released only once it is older than the moment the
//! read began (nothing earlier can still be in flight).

use crate::event::Event;

/// Events waiting for their turn, in arrival order until a release sorts
/// them: each ring arrives nearly sorted, so a stable sort of those few
/// runs is close to linear, and moves each (large) event a few times where
/// a binary heap moved it at every level.
#[derive(Default)]
pub struct Orderer {
    pending: Vec<Pending>,
    seq: u64,
}

impl Orderer {
    pub fn push(&mut self, ev: Event) {
        self.seq += 1;
        self.pending.push(Pending {
            ts: ev.header().ts_ns,
            seq: self.seq,
            ev,
        });
    }

    /// Every event older than `watermark` (all of them when None), oldest
    /// first; equal times keep their arrival order.
    pub fn release(&mut self, watermark: Option<u64>) -> Vec<Event> {
        self.pending.sort_by_key(|p| (p.ts, p.seq));
        let n = match watermark {
            Some(w) => self.pending.partition_point(|p| p.ts < w),
            None => self.pending.len(),
        };
        self.pending.drain(..n).map(|p| p.ev).collect()
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// An event waiting its turn: ordered by kernel time, then arrival.
struct Pending {
    ts: u64,
    seq: u64,
    ev: Event,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Header;

    fn fork(ts: u64, child: u32) -> Event {
        Event::Fork {
            h: Header {
                ts_ns: ts,
                ..Default::default()
            },
            child,
        }
    }

    fn children(v: &[Event]) -> Vec<u32> {
        v.iter()
            .map(|e| match e {
                Event::Fork { child, .. } => *child,
                _ => 0,
            })
            .collect()
    }

    #[test]
    fn releases_in_kernel_time_up_to_the_watermark() {
        let mut o = Orderer::default();
        // A failure ring read before the events ring: out of order.
        o.push(fork(30, 3));
        o.push(fork(10, 1));
        o.push(fork(20, 2));
        o.push(fork(20, 22));
        assert_eq!(children(&o.release(Some(25))), vec![1, 2, 22]);
        assert_eq!(o.len(), 1, "the event at the watermark waits");
        o.push(fork(25, 4));
        assert_eq!(children(&o.release(None)), vec![4, 3]);
        assert!(o.is_empty());
    }
}
