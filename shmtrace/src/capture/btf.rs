//! Just enough of a BTF reader to find struct member offsets in
//! /sys/kernel/btf/vmlinux: Rust eBPF has no CO-RE, so user space resolves
//! offsets and hands them to the programs.

use std::collections::HashMap;

use anyhow::{Context, Result, bail};

const MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Clone, Debug)]
struct Member {
    name: String,
    type_id: u32,
    bit_offset: u32,
}

#[derive(Clone, Debug)]
enum Type {
    /// struct or union
    Composite {
        size: u32,
        members: Vec<Member>,
    },
    /// A function prototype's parameter count.
    FuncProto(u32),
    /// typedef, const, volatile, restrict, type tag: look through
    Alias(u32),
    Other,
}

/// Parsed kernel BTF: types by id, struct/union ids by name, and enum
/// constants by name.
pub struct Btf {
    types: Vec<Type>,
    by_name: HashMap<String, Vec<u32>>,
    enumerators: HashMap<String, i64>,
    /// Kernel functions (BTF FUNC) by name, to their prototype's id.
    functions: HashMap<String, u32>,
}

impl Btf {
    pub fn from_sys() -> Result<Self> {
        let path = "/sys/kernel/btf/vmlinux";
        let data = std::fs::read(path).with_context(|| {
            format!(
                "cannot read {path}: this kernel has no BTF (CONFIG_DEBUG_INFO_BTF=y is needed \
                 so shmtrace can find kernel struct offsets)"
            )
        })?;
        Self::parse(&data).with_context(|| format!("cannot parse {path}"))
    }

    pub fn parse(data: &[u8]) -> Result<Self> {
        let u16_at = |o: usize| -> Result<u16> {
            Ok(u16::from_le_bytes(
                data.get(o..o + 2).context("truncated")?.try_into()?,
            ))
        };
        let u32_at = |o: usize| -> Result<u32> {
            Ok(u32::from_le_bytes(
                data.get(o..o + 4).context("truncated")?.try_into()?,
            ))
        };
        if u16_at(0)? != MAGIC {
            bail!("not BTF (bad magic)");
        }
        let hdr_len = u32_at(4)? as usize;
        let type_off = hdr_len + u32_at(8)? as usize;
        let type_len = u32_at(12)? as usize;
        let str_off = hdr_len + u32_at(16)? as usize;
        let str_len = u32_at(20)? as usize;
        let strings = data
            .get(str_off..str_off + str_len)
            .context("truncated strings")?;
        let name = |off: u32| -> String {
            let s = &strings[(off as usize).min(strings.len())..];
            let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
            String::from_utf8_lossy(&s[..end]).into_owned()
        };

        // Type id 0 is void.
        let mut types = vec![Type::Other];
        let mut by_name: HashMap<String, Vec<u32>> = HashMap::new();
        let mut enumerators = HashMap::new();
        let mut functions = HashMap::new();
        let mut p = type_off;
        let end = type_off + type_len;
        while p < end {
            let name_off = u32_at(p)?;
            let info = u32_at(p + 4)?;
            let size_or_type = u32_at(p + 8)?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            p += 12;
            let id = types.len() as u32;
            let ty = match kind {
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for i in 0..vlen {
                        let m = p + i * 12;
                        let off = u32_at(m + 8)?;
                        members.push(Member {
                            name: name(u32_at(m)?),
                            type_id: u32_at(m + 4)?,
                            bit_offset: if kind_flag { off & 0xff_ffff } else { off },
                        });
                    }
                    p += vlen * 12;
                    Type::Composite {
                        size: size_or_type,
                        members,
                    }
                }
                KIND_ENUM => {
                    for i in 0..vlen {
                        let e = p + i * 8;
                        // kind_flag set: the values are signed.
                        let v = u32_at(e + 4)?;
                        let v = if kind_flag { v as i32 as i64 } else { v as i64 };
                        enumerators.entry(name(u32_at(e)?)).or_insert(v);
                    }
                    p += vlen * 8;
                    Type::Other
                }
                KIND_ENUM64 => {
                    for i in 0..vlen {
                        let e = p + i * 12;
                        let v = ((u32_at(e + 8)? as u64) << 32) | u32_at(e + 4)? as u64;
                        enumerators.entry(name(u32_at(e)?)).or_insert(v as i64);
                    }
                    p += vlen * 12;
                    Type::Other
                }
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    Type::Alias(size_or_type)
                }
                KIND_INT | KIND_VAR | KIND_DECL_TAG => {
                    p += 4;
                    Type::Other
                }
                KIND_ARRAY => {
                    p += 12;
                    Type::Other
                }
                KIND_FUNC_PROTO => {
                    p += vlen * 8;
                    Type::FuncProto(vlen as u32)
                }
                KIND_DATASEC => {
                    p += vlen * 12;
                    Type::Other
                }
                KIND_FUNC => {
                    if name_off != 0 {
                        functions.entry(name(name_off)).or_insert(size_or_type);
                    }
                    Type::Other
                }
                KIND_PTR | KIND_FWD | KIND_FLOAT => Type::Other,
                k => bail!("unknown BTF kind {k} at type {id}"),
            };
            if matches!(ty, Type::Composite { .. }) && name_off != 0 {
                by_name.entry(name(name_off)).or_default().push(id);
            }
            types.push(ty);
        }
        Ok(Self {
            types,
            by_name,
            enumerators,
            functions,
        })
    }

    /// The value of enum constant `name` (e.g. `memory_cgrp_id`, whose
    /// value depends on the kernel's configuration).
    pub fn enum_value(&self, name: &str) -> Option<i64> {
        self.enumerators.get(name).copied()
    }

    /// The size of `struct name` in bytes.
    pub fn size(&self, strukt: &str) -> Option<u32> {
        self.by_name
            .get(strukt)?
            .iter()
            .find_map(|&id| match &self.types[id as usize] {
                Type::Composite { size, members } if !members.is_empty() => Some(*size),
                _ => None,
            })
    }

    /// The parameter count of kernel function `name`, when BTF has it (a
    /// function BTF lacks was inlined everywhere or renamed).
    pub fn function_params(&self, name: &str) -> Option<u32> {
        match self.types.get(*self.functions.get(name)? as usize)? {
            Type::FuncProto(n) => Some(*n),
            _ => None,
        }
    }

    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize) {
                Some(Type::Alias(next)) => id = *next,
                _ => break,
            }
        }
        id
    }

    /// Finds `member` in composite `id`, looking into anonymous structs and
    /// unions. Returns (byte offset, member type id).
    fn find(&self, id: u32, member: &str) -> Option<(u32, u32)> {
        let Type::Composite { members, .. } = self.types.get(self.resolve(id) as usize)? else {
            return None;
        };
        for m in members {
            if m.name == member {
                return Some((m.bit_offset / 8, m.type_id));
            }
        }
        for m in members.iter().filter(|m| m.name.is_empty()) {
            if let Some((off, ty)) = self.find(m.type_id, member) {
                return Some((m.bit_offset / 8 + off, ty));
            }
        }
        None
    }

    /// Byte offset of a dotted member path inside `struct name`, e.g.
    /// `offset("file", "f_path.dentry")`. Embedded structs only (no pointers).
    pub fn offset(&self, strukt: &str, path: &str) -> Option<u32> {
        let ids = self.by_name.get(strukt)?;
        // Several types may share a name (a forward-declared twin, a union):
        // take the first composite that has the path.
        'ids: for &id in ids {
            let mut ty = id;
            let mut total = 0;
            for part in path.split('.') {
                match self.find(ty, part) {
                    Some((off, next)) => {
                        total += off;
                        ty = next;
                    }
                    None => continue 'ids,
                }
            }
            return Some(total);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a tiny BTF blob: struct outer { int a; union { int b; long c; }; struct inner in; }
    /// struct inner { int x; int y; }
    fn blob() -> Vec<u8> {
        let strings = b"\0outer\0a\0b\0c\0in\0inner\0x\0y\0int\0ids\0cpu_id\0memory_id\0";
        let s = |n: &str| -> u32 {
            let needle = format!("\0{n}\0");
            (strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap()
                + 1) as u32
        };
        let mut t = Vec::new();
        let mut push = |v: u32| t.extend_from_slice(&v.to_le_bytes());
        // 1: int
        push(s("int"));
        push(KIND_INT << 24);
        push(4);
        push(32);
        // 2: struct inner { x@0, y@32 }
        push(s("inner"));
        push((KIND_STRUCT << 24) | 2);
        push(8);
        push(s("x"));
        push(1);
        push(0);
        push(s("y"));
        push(1);
        push(32);
        // 3: anonymous union { b, c }
        push(0);
        push((KIND_UNION << 24) | 2);
        push(8);
        push(s("b"));
        push(1);
        push(0);
        push(s("c"));
        push(1);
        push(0);
        // 4: struct outer { a@0, <anon>@64, in@128 }
        push(s("outer"));
        push((KIND_STRUCT << 24) | 3);
        push(24);
        push(s("a"));
        push(1);
        push(0);
        push(0);
        push(3);
        push(64);
        push(s("in"));
        push(2);
        push(128);
        // 5: enum ids { cpu_id = 0, memory_id = 4 }
        push(s("ids"));
        push((KIND_ENUM << 24) | 2);
        push(4);
        push(s("cpu_id"));
        push(0);
        push(s("memory_id"));
        push(4);
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.push(1);
        out.push(0);
        out.extend_from_slice(&24u32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(t.len() as u32).to_le_bytes());
        out.extend_from_slice(&(t.len() as u32).to_le_bytes());
        out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        out.extend_from_slice(&t);
        out.extend_from_slice(strings);
        out
    }

    #[test]
    fn finds_direct_anonymous_and_nested_members() {
        let btf = Btf::parse(&blob()).unwrap();
        assert_eq!(btf.offset("outer", "a"), Some(0));
        assert_eq!(btf.offset("outer", "c"), Some(8));
        assert_eq!(btf.offset("outer", "in.y"), Some(20));
        assert_eq!(btf.offset("outer", "nope"), None);
        assert_eq!(btf.offset("missing", "a"), None);
        // Enum constants, by name.
        assert_eq!(btf.enum_value("memory_id"), Some(4));
        assert_eq!(btf.enum_value("cpu_id"), Some(0));
        assert_eq!(btf.enum_value("nope"), None);
    }

    #[test]
    fn rejects_garbage() {
        assert!(Btf::parse(b"not btf at all, not at all").is_err());
    }
}
