//! The manifests an operator installs from deploy/: alerting rules that
//! Debian's promtool checks and unit-tests, the same rules as a
//! PrometheusRule, and a Service and ServiceMonitor that select the
//! DaemonSet's pods and port. (The DaemonSet's own args are run for real
//! in errors.rs.)

use std::{path::Path, process::Command};

use serde_json::Value;
use shmtrace_tests::*;

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(root_dir().join("deploy"))
        .output()
        .expect("promtool is missing: run scripts/setup.sh --test (Debian's prometheus)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// Every YAML document of a file, as JSON (Python's yaml, as kubectl would
/// read it: a syntax error fails here).
fn yaml(file: &str) -> Vec<Value> {
    let path = root_dir().join("deploy").join(file);
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import sys, json, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        Path::new(file).display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn alerting_rules_pass_promtool_check_and_their_unit_tests() {
    let check = promtool(&["check", "rules", "alerts.rules.yaml"]);
    assert!(check.contains("SUCCESS: 4 rules found"), "{check}");
    let test = promtool(&["test", "rules", "alerts.test.yaml"]);
    assert!(test.contains("SUCCESS"), "{test}");
    // Each alert has a test that makes it fire.
    let rules = &yaml("alerts.rules.yaml")[0];
    let tests = std::fs::read_to_string(root_dir().join("deploy/alerts.test.yaml")).unwrap();
    for r in rules["groups"][0]["rules"].as_array().unwrap() {
        let name = r["alert"].as_str().unwrap();
        assert!(
            tests.contains(&format!(
                "alertname: {name}\n        exp_alerts:\n          - exp_labels"
            )),
            "{name} is never tested firing"
        );
    }
}

#[test]
fn the_prometheus_rule_is_the_rules_file() {
    let plain = &yaml("alerts.rules.yaml")[0];
    let crd = &yaml("prometheusrule.yaml")[0];
    assert_eq!(crd["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(crd["kind"], "PrometheusRule");
    assert_eq!(
        crd["spec"]["groups"], plain["groups"],
        "prometheusrule.yaml and alerts.rules.yaml have drifted"
    );
}

#[test]
fn the_service_monitor_scrapes_the_daemonsets_metrics_port() {
    let ds = &yaml("daemonset.yaml")[0];
    let docs = yaml("servicemonitor.yaml");
    let svc = docs.iter().find(|d| d["kind"] == "Service").unwrap();
    let sm = docs.iter().find(|d| d["kind"] == "ServiceMonitor").unwrap();
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    let pod = &ds["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    // The Service selects the DaemonSet's pods, in its namespace.
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod["metadata"]["labels"][k], v, "Service selector {k}");
    }
    assert_eq!(svc["metadata"]["namespace"], ds["metadata"]["namespace"]);
    // Its port is the container's named metrics port, the one --metrics binds.
    let port = &svc["spec"]["ports"][0];
    let cport = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port["targetPort"])
        .expect("targetPort names a container port");
    assert_eq!(port["port"], cport["containerPort"]);
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let bind = args[args.iter().position(|a| *a == "--metrics").unwrap() + 1];
    assert!(
        bind.ends_with(&format!(":{}", cport["containerPort"])),
        "--metrics {bind} vs containerPort {}",
        cport["containerPort"]
    );
    // The ServiceMonitor selects the Service and scrapes that port by name.
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &svc["metadata"]["labels"][k], v,
            "ServiceMonitor selector {k}"
        );
    }
    assert!(
        sm["spec"]["namespaceSelector"]["matchNames"]
            .as_array()
            .unwrap()
            .contains(&svc["metadata"]["namespace"])
    );
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["port"], port["name"]);
    assert_eq!(ep["path"], "/metrics");
}
