//! Inspektor Gadget's filters for the live stream: `-n/--namespace`,
//! `-p/--podname`, `-c/--containername`. A process passes when its
//! container matches every filter given; with none given, everything does.

use crate::state::containers::Container;

#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        self.namespace.is_none() && self.pod.is_none() && self.container.is_none()
    }

    /// Whether something in container `c` (None: the host) is shown.
    pub fn matches(&self, c: Option<&Container>) -> bool {
        if self.is_empty() {
            return true;
        }
        let Some(c) = c else { return false };
        let pod = c.pod.as_ref();
        let ns_ok = self
            .namespace
            .as_ref()
            .is_none_or(|n| pod.is_some_and(|p| &p.namespace == n));
        let pod_ok = self
            .pod
            .as_ref()
            .is_none_or(|n| pod.is_some_and(|p| &p.name == n) || c.pod_uid.as_ref() == Some(n));
        let ctr_ok = self.container.as_ref().is_none_or(|n| {
            pod.and_then(|p| p.container.name.as_ref()) == Some(n)
                || c.name.as_ref() == Some(n)
                || c.container_id
                    .as_deref()
                    .is_some_and(|id| n.len() >= 12 && id.starts_with(n.as_str()))
        });
        ns_ok && pod_ok && ctr_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::containers::{Names, parse};

    #[test]
    fn filters_by_namespace_pod_and_container() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let mut k = parse(&format!(
            "/kubepods/besteffort/pod1b2c3d4e-0000-4000-8000-00000000beef/{id}"
        ));
        k.named(Names {
            container: Some("trainer".into()),
            pod_namespace: Some("ml".into()),
            pod_name: Some("job-0".into()),
        });
        let mut podman = parse(&format!("/libpod_parent/libpod-{id}"));
        podman.named(Names {
            container: Some("train".into()),
            ..Names::default()
        });
        let f = |n: Option<&str>, p: Option<&str>, c: Option<&str>| Filter {
            namespace: n.map(String::from),
            pod: p.map(String::from),
            container: c.map(String::from),
        };
        assert!(f(None, None, None).matches(None));
        assert!(f(Some("ml"), None, None).matches(Some(&k)));
        assert!(f(Some("ml"), Some("job-0"), Some("trainer")).matches(Some(&k)));
        assert!(!f(Some("default"), None, None).matches(Some(&k)));
        assert!(!f(None, Some("job-1"), None).matches(Some(&k)));
        assert!(f(None, None, Some("train")).matches(Some(&podman)));
        assert!(f(None, None, Some(&id[..12])).matches(Some(&podman)));
        assert!(!f(Some("ml"), None, None).matches(Some(&podman)));
        // The host is in no pod.
        assert!(!f(None, None, Some("train")).matches(None));
    }
}
