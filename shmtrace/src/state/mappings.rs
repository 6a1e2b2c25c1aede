//! Each process's tmpfs mappings: enough to turn a SIGBUS address into a
//! file and an offset, and to know who maps which file.

use std::collections::{BTreeSet, HashMap};

use crate::{
    event::{Addr, Dev, FileKey},
    host::MapsEntry,
};

/// A tmpfs file mapped into a process.
#[derive(Clone, Debug, PartialEq)]
pub struct Mapping {
    pub start: Addr,
    pub end: Addr,
    /// File offset of `start`, bytes.
    pub file_offset: u64,
    pub dev: Dev,
    pub ino: u64,
    /// File name as the kernel gave it (escaped), "parent/name" when nested.
    pub name: Option<String>,
    /// i_size when mapped (-1: unknown).
    pub size: i64,
}

impl Mapping {
    /// The file offset of `addr` (which must lie inside).
    pub fn offset_of(&self, addr: Addr) -> u64 {
        self.file_offset + (addr.0 - self.start.0)
    }

    pub fn contains(&self, addr: Addr) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// A mapping found in /proc/PID/maps (made before we traced it, or whose
/// event was lost): its size at mapping time is unknown.
impl From<MapsEntry> for Mapping {
    fn from(m: MapsEntry) -> Self {
        Self {
            start: m.start,
            end: m.end,
            file_offset: m.file_offset,
            dev: m.dev,
            ino: m.ino,
            name: m.name,
            size: -1,
        }
    }
}

#[derive(Default)]
pub struct MappingTable {
    by_pid: HashMap<u32, Vec<Mapping>>,
}

impl MappingTable {
    pub fn mapped(&mut self, pid: u32, m: Mapping) {
        let v = self.by_pid.entry(pid).or_default();
        remove_range(v, m.start.0, m.end.0);
        v.push(m);
    }

    /// Every tracked mapping as (pid, start, end, file): munmap is not
    /// hooked, so each is checked once a second and at a failure.
    pub fn checks(&self) -> Vec<(u32, Addr, Addr, FileKey)> {
        self.by_pid
            .keys()
            .flat_map(|&pid| self.checks_of(pid))
            .collect()
    }

    /// The same checks for one process (the target of a SIGBUS).
    pub fn checks_of(&self, pid: u32) -> Vec<(u32, Addr, Addr, FileKey)> {
        self.by_pid
            .get(&pid)
            .into_iter()
            .flatten()
            .map(|m| (pid, m.start, m.end, (m.dev, m.ino)))
            .collect()
    }

    /// `pid`'s tmpfs mappings as /proc shows them now (after an unmap, or
    /// a merge or split of its ranges): they replace ours, keeping the
    /// name and size an event gave a file.
    pub fn reread(&mut self, pid: u32, found: Vec<Mapping>) {
        let old = self.by_pid.remove(&pid).unwrap_or_default();
        let v: Vec<Mapping> = found
            .into_iter()
            .map(|mut m| {
                if let Some(o) = old.iter().find(|o| (o.dev, o.ino) == (m.dev, m.ino)) {
                    m.name = o.name.clone().or(m.name);
                    m.size = o.size;
                }
                m
            })
            .collect();
        if !v.is_empty() {
            self.by_pid.insert(pid, v);
        }
    }

    /// mremap: the pages move, keeping their file offsets.
    pub fn remapped(&mut self, pid: u32, old: Addr, old_len: u64, new: Addr, new_len: u64) {
        let Some(v) = self.by_pid.get_mut(&pid) else {
            return;
        };
        let Some(m) = v.iter().find(|m| m.contains(old)).cloned() else {
            return;
        };
        remove_range(v, old.0, old.0 + page_up(old_len));
        v.push(Mapping {
            start: new,
            end: Addr(new.0 + page_up(new_len)),
            file_offset: m.offset_of(old),
            ..m
        });
    }

    /// A child starts with its parent's mappings.
    pub fn forked(&mut self, parent: u32, child: u32) {
        if let Some(v) = self.by_pid.get(&parent).cloned() {
            self.by_pid.insert(child, v);
        }
    }

    /// exec or exit: the address space is gone.
    pub fn cleared(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
    }

    /// Processes mapping each file.
    pub fn holders(&self) -> HashMap<FileKey, BTreeSet<u32>> {
        let mut out: HashMap<FileKey, BTreeSet<u32>> = HashMap::new();
        for (pid, v) in &self.by_pid {
            for m in v {
                out.entry((m.dev, m.ino)).or_default().insert(*pid);
            }
        }
        out
    }

    pub fn find(&self, pid: u32, addr: Addr) -> Option<&Mapping> {
        self.by_pid
            .get(&pid)?
            .iter()
            .rev()
            .find(|m| m.contains(addr))
    }

    pub fn processes(&self) -> usize {
        self.by_pid.len()
    }
}

fn page_up(len: u64) -> u64 {
    let page = crate::units::page_size();
    len.div_ceil(page) * page
}

/// Cuts [start, end) out of the mappings, splitting those it overlaps.
fn remove_range(v: &mut Vec<Mapping>, start: u64, end: u64) {
    let mut out = Vec::with_capacity(v.len() + 1);
    for m in v.drain(..) {
        if m.end.0 <= start || m.start.0 >= end {
            out.push(m);
            continue;
        }
        if m.start.0 < start {
            out.push(Mapping {
                end: Addr(start),
                ..m.clone()
            });
        }
        if m.end.0 > end {
            out.push(Mapping {
                start: Addr(end),
                file_offset: m.file_offset + (end - m.start.0),
                ..m.clone()
            });
        }
    }
    *v = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(start: u64, end: u64, off: u64) -> Mapping {
        Mapping {
            start: Addr(start),
            end: Addr(end),
            file_offset: off,
            dev: Dev(1),
            ino: 2,
            name: None,
            size: 0,
        }
    }

    #[test]
    fn a_reread_after_an_unmap_splits_and_remap_moves() {
        let mut t = MappingTable::default();
        t.mapped(
            1,
            Mapping {
                name: Some("seg".into()),
                ..m(0x10000, 0x20000, 0)
            },
        );
        // A page was unmapped: /proc shows two ranges now.
        t.reread(1, vec![m(0x10000, 0x14000, 0), m(0x15000, 0x20000, 0x5000)]);
        assert_eq!(
            t.find(1, Addr(0x13000)).unwrap().name.as_deref(),
            Some("seg")
        );
        assert!(t.find(1, Addr(0x14000)).is_none());
        let off = |t: &MappingTable, a: u64| t.find(1, Addr(a)).map(|m| m.offset_of(Addr(a)));
        assert_eq!(off(&t, 0x15000), Some(0x5000));
        assert_eq!(off(&t, 0x13000), Some(0x3000));
        t.remapped(1, Addr(0x15000), 0x1000, Addr(0x90000), 0x2000);
        assert_eq!(off(&t, 0x91000), Some(0x6000));
        assert!(t.find(1, Addr(0x15000)).is_none());
        t.forked(1, 2);
        assert!(t.find(2, Addr(0x91000)).is_some());
        t.cleared(1);
        assert!(t.find(1, Addr(0x91000)).is_none());
        assert_eq!(t.holders()[&(Dev(1), 2)], BTreeSet::from([2]));
    }

    #[test]
    fn a_later_mapping_hides_the_earlier_one() {
        let mut t = MappingTable::default();
        t.mapped(1, m(0x10000, 0x20000, 0));
        t.mapped(
            1,
            Mapping {
                ino: 3,
                ..m(0x18000, 0x19000, 0)
            },
        );
        assert_eq!(t.find(1, Addr(0x18000)).unwrap().ino, 3);
        assert_eq!(
            t.find(1, Addr(0x19000)).unwrap().offset_of(Addr(0x19000)),
            0x9000
        );
        t.reread(1, vec![]);
        assert_eq!(t.processes(), 0, "an empty table is dropped");
    }
}
