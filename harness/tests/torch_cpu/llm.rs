//! The probe's LLM rows on CPU: gradients, optimizer state and transients per implementation; refusals.
use super::*;

#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn tiny_llama_gradients_state_and_transients_per_implementation() {
    let dir = tempfile::tempdir().unwrap();
    let (config, scenario) = tiny(dir.path());
    let p = params(&config);
    for implementation in ["foreach", "for-loop", "fused"] {
        let out = dir.path().join(format!("tiny-{implementation}.csv"));
        let rows = torch_cpu(&scenario, &out, implementation);
        for (precision, bytes) in [("f32", 4), ("mixed-bf16", 4)] {
            for (b, c) in [(1, 16), (2, 32)] {
                let point =
                    format!("synthetic-tiny/train/{precision}/b{b}/c{c}/adamw/none/ga1/full");
                let point = point.replace("synthetic-tiny", &rows[0].model_id);
                check_training(&rows, &point, &p, bytes, implementation);
            }
        }
        if implementation == "foreach" {
            let constants = dir.path().join("tiny.toml.fit");
            vramlab()
                .arg("fit")
                .arg(&out)
                .arg("--out")
                .arg(&constants)
                .assert()
                .success();
            assert!(std::fs::read_to_string(&constants)
                .unwrap()
                .contains("llama"));
        }
    }
}

#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn smollm2_gguf_gradients_state_and_transients_per_implementation() {
    let gguf = common::smollm2_gguf();
    let p = params(&root().join("harness/presets/smollm2-135m/config.json"));
    assert_eq!(p.count, SMOLLM2_PARAMS);
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("smollm2.toml");
    std::fs::write(
        &scenario,
        format!(
            "name = \"smollm2-torch\"\ndevice = \"cpu\"\n[model]\nsource = \"gguf:{}\"\n\
             [sweep]\nmode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [1]\ncontext = [64]\n\
             optimizer = [\"adamw\"]\ntrain_steps = 2\n",
            gguf.display()
        ),
    )
    .unwrap();
    // One implementation on the real model (the tiny llama above runs all three): the for-loop,
    // whose transient is the model's own largest tensor (the tied embedding), twice.
    {
        let implementation = "for-loop";
        let out = dir.path().join(format!("smollm2-{implementation}.csv"));
        let rows = torch_cpu(&scenario, &out, implementation);
        let point = "SmolLM2-135M-Instruct.Q4_1/train/f32/b1/c64/adamw/none/ga1/full";
        check_training(&rows, point, &p, 4, implementation);
        let load = rows
            .iter()
            .find(|r| r.point_id == point && r.phase == Some(Phase::Load))
            .unwrap();
        assert_eq!(load.feature_weight_bytes, Some(SMOLLM2_PARAMS * 4));
        vramlab()
            .arg("fit")
            .arg(&out)
            .arg("--out")
            .arg(dir.path().join("smollm2.fit.toml"))
            .assert()
            .success();
    }
}

#[test]
fn an_unrunnable_scenario_is_one_line_and_exit_2() {
    let out = probe_without_torch(&format!("{SMALL}kernels = [\"fused\"]\n"));
    one_line_exit_2(&out, "cannot run `kernels = \"fused\"`");
    // What vramlab refuses is vramlab's line: the probe runs vramlab's points.
    let out = probe_without_torch(&format!("{SMALL}trainable = [\"lora-rx\"]\n"));
    one_line_exit_2(&out, "LoRA rank in `lora-rx` must be an integer");
}

#[test]
fn cpu_without_the_preload_meter_is_one_line_and_exit_2() {
    let out = probe_without_torch(SMALL);
    one_line_exit_2(&out, "LD_PRELOAD=libvramlab_preload.so");
}
