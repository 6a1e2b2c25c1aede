//! The report's and the incident file's JSON Schema (schema/), generated
//! from the types that serialize them, so it cannot drift: the committed
//! files must equal what these types generate (`SHMTRACE_BLESS=1`
//! rewrites them), every property must be described, and the golden
//! reports must validate. The suite validates real reports against the
//! same files.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, generate::SchemaSettings, json_schema};
use serde_json::Value;

use crate::{
    analysis::{Report, incident::IncidentReport},
    event::{Addr, CudaCall, Dev, Syscall},
    signals::ErrnoName,
    state::{
        causes::Reason,
        failures::{FailureKind, NotShm, Op},
    },
};

/// A string type with a fixed set of values (the names these types print).
fn names(description: &str, values: &[&str]) -> Schema {
    json_schema!({"type": "string", "enum": values, "description": description})
}

impl JsonSchema for Addr {
    fn schema_name() -> Cow<'static, str> {
        "Addr".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string", "pattern": "^0x[0-9a-f]+$",
            "description": "A user-space address in hex, as the kernel and gdb print it (\"0x7f0000800000\")."
        })
    }
}

impl JsonSchema for Dev {
    fn schema_name() -> Cow<'static, str> {
        "Dev".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string", "pattern": "^[0-9]+:[0-9]+$",
            "description": "A superblock's device, major:minor as /proc/self/mountinfo prints it (\"0:40\")."
        })
    }
}

impl JsonSchema for ErrnoName {
    fn schema_name() -> Cow<'static, str> {
        "ErrnoName".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string", "pattern": "^(E[A-Z0-9]+|\\?)$",
            "description": "The errno's symbolic name (\"ENOSPC\"), \"?\" for an unknown one."
        })
    }
}

impl JsonSchema for Syscall {
    fn schema_name() -> Cow<'static, str> {
        "Syscall".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let v: Vec<&str> = Syscall::ALL.iter().map(|s| s.name()).collect();
        names("A syscall by name.", &v)
    }
}

impl JsonSchema for CudaCall {
    fn schema_name() -> Cow<'static, str> {
        "CudaCall".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let v: Vec<&str> = CudaCall::ALL.iter().map(|s| s.name()).collect();
        names("A CUDA IPC call by name (runtime or driver API).", &v)
    }
}

impl JsonSchema for Op {
    fn schema_name() -> Cow<'static, str> {
        "Op".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let v: Vec<&str> = Syscall::ALL
            .iter()
            .map(|s| s.name())
            .chain(CudaCall::ALL.iter().map(|c| c.name()))
            .collect();
        names(
            "The call that failed: a syscall, or a CUDA IPC function, by name.",
            &v,
        )
    }
}

impl JsonSchema for FailureKind {
    fn schema_name() -> Cow<'static, str> {
        "FailureKind".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let v: Vec<&str> = FailureKind::ALL.iter().map(|k| k.name()).collect();
        names(
            "What failed, by family: a SIGBUS on a tmpfs page, the errno of a failed call (error: another errno), an mmap or mremap refused, an OOM kill, a CUDA IPC error.",
            &v,
        )
    }
}

impl JsonSchema for Reason {
    fn schema_name() -> Cow<'static, str> {
        "Reason".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let v: Vec<&str> = Reason::ALL.iter().map(|r| r.name()).collect();
        names(
            "The cause by name: only tmpfs_full and tmpfs_inodes mean /dev/shm ran out; the others have fixes of their own.",
            &v,
        )
    }
}

impl JsonSchema for NotShm {
    fn schema_name() -> Cow<'static, str> {
        "NotShm".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let v: Vec<&str> = NotShm::ALL.iter().map(|r| r.words()).collect();
        names("Why a SIGBUS was no shared-memory failure, in words.", &v)
    }
}

/// The schema of `T`, for what shmtrace writes (every key present).
fn schema_of<T: JsonSchema>(id: &str, title: &str) -> Value {
    let generator = SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator();
    let mut s = generator.into_root_schema_for::<T>();
    let obj = s.as_object_mut().expect("an object schema");
    obj.insert("$id".into(), id.into());
    obj.insert("title".into(), title.into());
    serde_json::to_value(&s).unwrap()
}

pub const REPORT: &str = "report.v2.schema.json";
pub const INCIDENT: &str = "incident.v2.schema.json";

fn generated() -> [(&'static str, Value); 2] {
    [
        (
            REPORT,
            schema_of::<Report>(
                "https://shmtrace.dev/schema/report.v2.schema.json",
                "shmtrace report, schema 2 (--report FILE)",
            ),
        ),
        (
            INCIDENT,
            schema_of::<IncidentReport>(
                "https://shmtrace.dev/schema/incident.v2.schema.json",
                "shmtrace incident, schema 2 (--incidents-dir DIR, and incidents[] of the report)",
            ),
        ),
    ]
}

fn schema_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema")
}

#[test]
fn the_committed_schemas_are_what_the_types_generate() {
    for (file, schema) in generated() {
        let path = schema_dir().join(file);
        let text = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        if std::env::var_os("SHMTRACE_BLESS").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == text,
            "{} differs from what the report's types generate: rerun with SHMTRACE_BLESS=1 and review the diff",
            path.display()
        );
    }
}

/// Each property, at any depth, with the path that leads to it.
fn properties<'a>(v: &'a Value, path: String, out: &mut Vec<(String, &'a Value)>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Object(props)) = m.get("properties") {
                for (k, p) in props {
                    out.push((format!("{path}.{k}"), p));
                }
            }
            for (k, x) in m {
                properties(x, format!("{path}/{k}"), out);
            }
        }
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, x)| properties(x, format!("{path}[{i}]"), out)),
        _ => {}
    }
}

#[test]
fn every_property_is_documented_and_required() {
    for (file, schema) in generated() {
        let mut props = Vec::new();
        properties(&schema, String::new(), &mut props);
        assert!(props.len() > 100, "{file}: {}", props.len());
        let undocumented: Vec<&str> = props
            .iter()
            .filter(|(_, p)| {
                // A property that is a bare $ref is documented by its type.
                let described = p.get("description").is_some();
                let by_ref = p.get("$ref").is_some()
                    || p.get("anyOf").is_some_and(|a| {
                        a.as_array()
                            .unwrap()
                            .iter()
                            .any(|x| x.get("$ref").is_some())
                    });
                !described && !by_ref
            })
            .map(|(k, _)| k.as_str())
            .collect();
        assert!(
            undocumented.is_empty(),
            "{file}: properties without a description (add a doc comment): {undocumented:#?}"
        );
    }
    // Absent never means null: every key is always written.
    let (_, schema) = &generated()[0];
    for def in schema["$defs"].as_object().unwrap().values() {
        if let (Some(props), Some(req)) = (def.get("properties"), def.get("required")) {
            assert_eq!(
                props.as_object().unwrap().len(),
                req.as_array().unwrap().len(),
                "every key is required: {def:#}"
            );
        }
    }
}

#[test]
fn the_golden_reports_validate() {
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(schema_dir().join(REPORT)).unwrap()).unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/analysis/golden");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let report: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let errors: Vec<String> = v
            .iter_errors(&report)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{}: {errors:#?}", path.display());
        n += 1;
    }
    assert!(n >= 5);
    // A report with a key missing or of the wrong type does not.
    let mut bad: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("src/analysis/golden/dataloader_sigbus.json"),
        )
        .unwrap(),
    )
    .unwrap();
    bad["first_failure"]["tie_ns"] = "soon".into();
    bad.as_object_mut().unwrap().remove("verify");
    assert_eq!(v.iter_errors(&bad).count(), 2);
}
