//! Builds the eBPF programs (shmtrace-ebpf) for bpfel-unknown-none and puts
//! the object in OUT_DIR, where src/tracer.rs embeds it.

fn main() -> anyhow::Result<()> {
    // Without these, any change in this package reruns the nested eBPF
    // build (about a minute); only the eBPF sources and the wire format
    // it shares change what it makes.
    for dir in ["../shmtrace-ebpf", "../shmtrace-common", "build.rs"] {
        println!("cargo:rerun-if-changed={dir}");
    }
    // The eBPF target has no prebuilt core: build-std needs RUSTC_BOOTSTRAP
    // on the stable toolchain. Only the nested eBPF build sees this.
    if std::env::var_os("RUSTC_BOOTSTRAP").is_none() {
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    }
    let package = aya_build::Package {
        name: "shmtrace-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../shmtrace-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom("stable"))
}
