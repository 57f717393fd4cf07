//! The wasm build answers byte for byte what the native build answers.
//!
//! Runs `target/wasm/cohort_fingerprint.wasm` (built by `scripts/build-wasm`; override
//! with `COHORT_WASM`) in the wasmi interpreter and compares its output record — sketch
//! bytes, block hashes, keys, masked text, bypass reasons — with the native record for a
//! corpus of request bodies, bad inputs and Banking77 sentences in all three modes.
//! A missing module fails the test: it is built by the README's test command.

use cohort_fingerprint_wasm::record_json;
use std::path::{Path, PathBuf};
use wasmi::{Engine, ExternType, Instance, Linker, Memory, Module, Store, TypedFunc, Val};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

struct WasmFingerprinter {
    store: Store<()>,
    memory: Memory,
    alloc: TypedFunc<i32, i32>,
    free: TypedFunc<(i32, i32), ()>,
    fingerprint: TypedFunc<(i32, i32), i64>,
}

impl WasmFingerprinter {
    fn load() -> Self {
        let path = std::env::var_os("COHORT_WASM")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace().join("target/wasm/cohort_fingerprint.wasm"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!("{}: {e}; build it with scripts/build-wasm", path.display())
        });
        let engine = Engine::default();
        let module = Module::new(&engine, &bytes).expect("valid wasm module");
        let mut store = Store::new(&engine, ());
        let mut linker = Linker::<()>::new(&engine);
        // A wasm32-wasip1 build imports a few WASI calls that std only uses for I/O we never
        // do; answer them with ENOSYS so any accidental use is visible as an error.
        for import in module.imports() {
            if let ExternType::Func(ty) = import.ty() {
                linker
                    .func_new(
                        import.module(),
                        import.name(),
                        ty.clone(),
                        |_, _, results| {
                            for result in results.iter_mut() {
                                *result = Val::I32(52);
                            }
                            Ok(())
                        },
                    )
                    .unwrap();
            }
        }
        let instance: Instance = linker
            .instantiate(&mut store, &module)
            .and_then(|pre| pre.start(&mut store))
            .expect("module instantiates");
        if let Ok(init) = instance.get_typed_func::<(), ()>(&store, "_initialize") {
            init.call(&mut store, ()).unwrap();
        }
        WasmFingerprinter {
            memory: instance
                .get_memory(&store, "memory")
                .expect("exports memory"),
            alloc: instance.get_typed_func(&store, "cohort_alloc").unwrap(),
            free: instance.get_typed_func(&store, "cohort_free").unwrap(),
            fingerprint: instance
                .get_typed_func(&store, "cohort_fingerprint_line")
                .unwrap(),
            store,
        }
    }

    fn record(&mut self, line: &[u8]) -> String {
        let len = line.len() as i32;
        let ptr = self.alloc.call(&mut self.store, len).unwrap();
        self.memory
            .write(&mut self.store, ptr as usize, line)
            .unwrap();
        let packed = self.fingerprint.call(&mut self.store, (ptr, len)).unwrap() as u64;
        self.free.call(&mut self.store, (ptr, len)).unwrap();
        let (out_ptr, out_len) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
        let mut out = vec![0u8; out_len];
        self.memory.read(&self.store, out_ptr, &mut out).unwrap();
        self.free
            .call(&mut self.store, (out_ptr as i32, out_len as i32))
            .unwrap();
        String::from_utf8(out).expect("records are UTF-8 JSON")
    }
}

fn corpus() -> Vec<Vec<u8>> {
    let mut lines = Vec::new();
    let bodies = workspace().join("fingerprint/tests/bodies");
    for entry in std::fs::read_dir(&bodies).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        lines.push(serde_json::to_vec(&value).unwrap());
        for mode in ["intent", "topic", "hybrid"] {
            let envelope = serde_json::json!({"body": value, "headers": {"x-cohort-semantic-mode": mode, "x-cohort-batch-threshold": "NaN"}, "tenant": "acme"});
            lines.push(serde_json::to_vec(&envelope).unwrap());
        }
    }
    for bad in [
        &b"{not json"[..],
        b"[1,2,3]",
        b"\xff\xfe\x00",
        br#"{"model":"m","messages":[]}"#,
        br#"{"model":"m","messages":"x"}"#,
        "{\"text\":\"🔥🔥 caf\u{e9} \u{200B}zero width ｆｕｌｌ ﬁ \u{202E}bidi 我想退款\"}"
            .as_bytes(),
    ] {
        lines.push(bad.to_vec());
    }
    lines.push(format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes());
    let rows = cohort_fingerprint::banking77::test_split();
    for (i, row) in rows.iter().step_by(10).enumerate() {
        let text = row.text.as_str();
        let mode = ["intent", "topic", "hybrid"][i % 3];
        lines.push(
            serde_json::to_vec(&serde_json::json!({"text": text, "semantic_mode": mode})).unwrap(),
        );
        lines.push(
            serde_json::to_vec(&serde_json::json!({"model": "m", "system": "be kind", "messages": [{"role": "user", "content": text}]}))
                .unwrap(),
        );
    }
    lines
}

#[test]
fn wasm_and_native_records_are_identical() {
    let mut wasm = WasmFingerprinter::load();
    let corpus = corpus();
    let mut sketched = 0;
    for line in &corpus {
        let native = record_json(line);
        let from_wasm = wasm.record(line);
        assert_eq!(from_wasm, native, "line: {}", String::from_utf8_lossy(line));
        sketched += usize::from(native.contains("\"sketch\""));
    }
    println!(
        "{} lines, {sketched} with sketches: wasm == native byte for byte",
        corpus.len()
    );
    assert!(sketched > 500, "the corpus exercises the sketch");
}
