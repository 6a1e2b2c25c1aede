use which::which;

/// Rebuild the eBPF object when bpf-linker changes: cargo cannot see it otherwise.
fn main() {
    if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
