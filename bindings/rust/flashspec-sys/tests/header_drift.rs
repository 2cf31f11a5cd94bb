//! Fails when src/lib.rs drifts from include/flashspec.h: every exported
//! function with its parameter and return types, every struct's fields and
//! field types, every enum value, and — compiled by the C compiler — every
//! struct's size, alignment and field offsets.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

const LIB_RS: &str = include_str!("../src/lib.rs");

fn header_path() -> PathBuf {
    std::env::var_os("FLASHSPEC_HEADER").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../include/flashspec.h")
    })
}

/// The header without comments, preprocessor lines or line continuations.
fn header_code() -> String {
    let text = std::fs::read_to_string(header_path()).expect("read include/flashspec.h");
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find("*/").expect("unterminated comment") + start + 2;
        rest = &rest[end..];
    }
    out.push_str(rest);
    let mut code = String::new();
    let mut continued = false;
    for line in out.lines() {
        let line = line.split("//").next().unwrap();
        let directive = continued || line.trim_start().starts_with('#');
        continued = directive && line.trim_end().ends_with('\\');
        if !directive {
            code.push_str(line);
            code.push('\n');
        }
    }
    code
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A C type as it is spelled in src/lib.rs.
fn rust_type(c: &str) -> String {
    let spaced = c.replace('*', " * ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let base = tokens.iter().find(|t| **t != "const" && **t != "*").expect("a type");
    let mut ty = match *base {
        "void" => "c_void",
        "int32_t" => "i32",
        "uint32_t" => "u32",
        "int64_t" => "i64",
        "uint64_t" => "u64",
        "float" => "f32",
        "double" => "f64",
        "size_t" => "usize",
        "unsigned" => "c_uint",
        "int" => "c_int",
        "char" => "c_char",
        other => other,
    }
    .to_string();
    let Some(first_star) = tokens.iter().position(|t| *t == "*") else {
        return if ty == "c_void" { "()".into() } else { ty };
    };
    let mut pointee_const = tokens[..first_star].contains(&"const");
    let mut i = first_star;
    while i < tokens.len() {
        if tokens[i] == "*" {
            ty = format!("{} {ty}", if pointee_const { "*const" } else { "*mut" });
            pointee_const = tokens.get(i + 1) == Some(&"const");
        }
        i += 1;
    }
    ty
}

/// (name, rust type) of each parameter; arrays decay to pointers.
fn parameters(list: &str) -> Vec<(String, String)> {
    let list = list.trim();
    if list.is_empty() || list == "void" {
        return vec![];
    }
    list.split(',')
        .map(|p| {
            let p = p.trim();
            if let Some(open) = p.find('[') {
                let before = p[..open].trim();
                let name_at = before.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
                return (before[name_at..].to_string(), rust_type(&format!("{}*", &before[..name_at])));
            }
            let words: Vec<&str> = p.split_whitespace().collect();
            let unnamed = p.ends_with('*') || words.len() == 1 || (words.len() == 2 && words[0] == "const");
            if unnamed {
                return ("_".into(), rust_type(p));
            }
            let name_at = p.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
            (p[name_at..].to_string(), rust_type(&p[..name_at]))
        })
        .collect()
}

fn ret_suffix(ret: &str) -> String {
    if ret == "()" { String::new() } else { format!(" -> {ret}") }
}

/// name -> "(types) -> ret" of every FLASHSPEC_API function of the header.
fn header_functions(code: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for chunk in code.split("FLASHSPEC_API").skip(1) {
        let decl = squash(&chunk[..chunk.find(';').expect("prototype ends with ;")]);
        let open = decl.find('(').unwrap();
        let head = decl[..open].trim();
        let name_at = head.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        let (ret, name) = (rust_type(&head[..name_at]), head[name_at..].to_string());
        let params = parameters(&decl[open + 1..decl.rfind(')').unwrap()]);
        let types: Vec<String> = params.into_iter().map(|(_, t)| t).collect();
        out.insert(name, format!("({}){}", types.join(", "), ret_suffix(&ret)));
    }
    out
}

/// The same for the extern block of src/lib.rs.
fn declared_functions() -> BTreeMap<String, String> {
    let block = &LIB_RS[LIB_RS.find("extern \"C\" {").expect("extern block")..];
    let mut out = BTreeMap::new();
    for decl in block.split(';') {
        let decl = squash(decl);
        let Some(at) = decl.find("pub fn ") else { continue };
        let decl = &decl[at + 7..];
        let open = decl.find('(').unwrap();
        let close = decl.rfind(')').unwrap();
        let types: Vec<String> = decl[open + 1..close]
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| p.split_once(':').expect("name: type").1.trim().to_string())
            .collect();
        let ret = decl[close + 1..].trim().strip_prefix("->").map_or("()".to_string(), |r| r.trim().to_string());
        out.insert(decl[..open].trim().to_string(), format!("({}){}", types.join(", "), ret_suffix(&ret)));
    }
    out
}

/// struct name -> [(field, rust type)] of the header's structs.
fn header_structs(code: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out = BTreeMap::new();
    for chunk in code.split("typedef struct ").skip(1) {
        // Opaque handles (`typedef struct x x;`) have no body.
        let Some(open) = chunk.find('{').filter(|&o| chunk.find(';').map_or(true, |s| o < s)) else {
            continue;
        };
        let name = chunk[..open].trim().to_string();
        let body = &chunk[open + 1..chunk.find('}').unwrap()];
        let fields = body
            .split(';')
            .map(squash)
            .filter(|f| !f.is_empty())
            .map(|f| {
                if let Some(star) = f.find("(*") {
                    // A function pointer member: ret (*name)(params).
                    let close = f[star..].find(')').unwrap() + star;
                    let params = parameters(&f[close + 2..f.len() - 1]);
                    let types: Vec<String> = params.into_iter().map(|(_, t)| t).collect();
                    let ty = format!(
                        "Option<unsafe extern \"C\" fn({}){}>",
                        types.join(", "),
                        ret_suffix(&rust_type(&f[..star]))
                    );
                    (f[star + 2..close].trim().to_string(), ty)
                } else {
                    let name_at = f.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
                    (f[name_at..].to_string(), rust_type(&f[..name_at]))
                }
            })
            .collect();
        out.insert(name, fields);
    }
    out
}

fn declared_structs() -> BTreeMap<String, Vec<(String, String)>> {
    let mut out = BTreeMap::new();
    for chunk in LIB_RS.split("pub struct ").skip(1) {
        let open = chunk.find('{').unwrap();
        let name = chunk[..open].trim().to_string();
        let body = &chunk[open + 1..chunk.find("\n}").unwrap()];
        let fields = body
            .lines()
            .map(str::trim)
            .filter_map(|l| l.strip_prefix("pub "))
            .map(|l| {
                let (n, t) = l.split_once(':').unwrap();
                (n.trim().to_string(), t.trim().trim_end_matches(',').to_string())
            })
            .collect();
        out.insert(name, fields);
    }
    out
}

#[test]
fn every_function_matches_the_header() {
    let header = header_functions(&header_code());
    let declared = declared_functions();
    assert!(header.len() >= 29, "parsed only {} prototypes", header.len());
    let mut problems = vec![];
    for (name, sig) in &header {
        match declared.get(name) {
            None => problems.push(format!("missing in lib.rs: {name}{sig}")),
            Some(d) if d != sig => problems.push(format!("{name}: header {sig}, lib.rs {d}")),
            _ => {}
        }
    }
    for name in declared.keys().filter(|n| !header.contains_key(*n)) {
        problems.push(format!("declared in lib.rs but not in the header: {name}"));
    }
    assert!(problems.is_empty(), "flashspec-sys drifted from flashspec.h:\n{}", problems.join("\n"));
}

#[test]
fn every_struct_field_matches_the_header() {
    let header = header_structs(&header_code());
    let declared = declared_structs();
    let mut problems = vec![];
    for (name, fields) in &header {
        match declared.get(name) {
            None => problems.push(format!("struct {name} missing in lib.rs")),
            Some(d) if d != fields => problems.push(format!("struct {name}:\n  header {fields:?}\n  lib.rs {d:?}")),
            _ => {}
        }
    }
    assert!(problems.is_empty(), "flashspec-sys structs drifted:\n{}", problems.join("\n"));
}

#[test]
fn every_enum_value_matches_the_header() {
    let code = header_code();
    let text = std::fs::read_to_string(header_path()).unwrap();
    let mut header = BTreeMap::new();
    // Status codes come from the X-macro table: X(NAME, value, "text").
    for chunk in text.split("X(").skip(1) {
        let mut parts = chunk.splitn(3, ',');
        let (name, value) = (parts.next().unwrap().trim(), parts.next().unwrap_or("").trim());
        if let Ok(v) = value.parse::<i64>() {
            header.insert(format!("FLASHSPEC_{name}"), v);
        }
    }
    for chunk in code.split("typedef enum").skip(1) {
        let body = &chunk[chunk.find('{').unwrap() + 1..chunk.find('}').unwrap()];
        for item in body.split(',') {
            if let Some((n, v)) = item.split_once('=') {
                let (n, v) = (n.trim(), v.trim());
                if !n.ends_with("FORCE_32BIT_") && !n.contains("STATUS_TABLE") {
                    header.insert(n.to_string(), v.parse::<i64>().expect(n));
                }
            }
        }
    }
    let mut declared = BTreeMap::new();
    for line in LIB_RS.lines().filter_map(|l| l.strip_prefix("pub const ")) {
        let (name, rest) = line.split_once(':').unwrap();
        if let Ok(v) = rest.split('=').nth(1).unwrap().trim().trim_end_matches(';').parse::<i64>() {
            declared.insert(name.trim().to_string(), v);
        }
    }
    for (name, value) in &header {
        assert_eq!(declared.get(name), Some(value), "{name}");
    }
}

/// The value of a constant expression of the forms the limits use:
/// `1024`, `0x7fffffff`, `(1 << 20)`.
fn constant_value(expression: &str) -> i64 {
    let e: String = expression.chars().filter(|c| !c.is_whitespace() && *c != '(' && *c != ')').collect();
    let number = |s: &str| match s.strip_prefix("0x") {
        Some(hex) => i64::from_str_radix(hex, 16).expect(expression),
        None => s.parse::<i64>().expect(expression),
    };
    match e.split_once("<<") {
        Some((a, b)) => number(a) << number(b),
        None => number(&e),
    }
}

#[test]
fn every_limit_matches_the_header() {
    let text = std::fs::read_to_string(header_path()).unwrap();
    let mut header = BTreeMap::new();
    for line in text.lines().filter_map(|l| l.trim_start().strip_prefix("#define ")) {
        let line = line.split("/*").next().unwrap();
        let Some((name, value)) = line.trim().split_once(char::is_whitespace) else { continue };
        if name.starts_with("FLASHSPEC_MAX_") || name == "FLASHSPEC_TOP_K_ALL" {
            header.insert(name.to_string(), constant_value(value));
        }
    }
    assert!(header.len() >= 6, "{header:?}");
    let mut declared = BTreeMap::new();
    for line in LIB_RS.lines().filter_map(|l| l.strip_prefix("pub const ")) {
        let (name, rest) = line.split_once(':').unwrap();
        if header.contains_key(name.trim()) {
            declared.insert(name.trim().to_string(), constant_value(rest.split('=').nth(1).unwrap().trim().trim_end_matches(';')));
        }
    }
    assert_eq!(declared, header);
}

#[test]
fn the_draft_support_tolerance_matches_the_header() {
    let text = std::fs::read_to_string(header_path()).unwrap();
    let value = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("#define FLASHSPEC_DRAFT_SUPPORT_TOLERANCE"))
        .expect("FLASHSPEC_DRAFT_SUPPORT_TOLERANCE in the header");
    assert_eq!(value.trim().parse::<f64>().unwrap(), flashspec_sys::FLASHSPEC_DRAFT_SUPPORT_TOLERANCE);
}

// ---- layout, measured by the C compiler ------------------------------------
macro_rules! layouts {
    ($($name:ident { $($field:ident),* $(,)? })*) => {
        /// (struct, [fields]), each with Rust's size, align and offsets.
        fn rust_layouts() -> Vec<(&'static str, Vec<&'static str>, String)> {
            vec![$({
                let mut report = format!("{} {} {}\n", stringify!($name),
                    core::mem::size_of::<flashspec_sys::$name>(),
                    core::mem::align_of::<flashspec_sys::$name>());
                $(report.push_str(&format!("{}.{} {}\n", stringify!($name), stringify!($field),
                    core::mem::offset_of!(flashspec_sys::$name, $field)));)*
                (stringify!($name), vec![$(stringify!($field)),*], report)
            }),*]
        }
    };
}

layouts! {
        flashspec_tensor { data, dtype, memory, rows, cols, row_stride }
        flashspec_context_params { struct_size, backend, device_ordinal, cuda_stream, seed, cpu_threads, max_rows, max_requests }
        flashspec_sampling_controls { struct_size, top_k, top_p, min_p, bias_offsets, bias_tokens, bias_values, token_mask, mask_words, typical_epsilon, typical_delta, repetition_penalty }
        flashspec_draft_params { struct_size, memory, temperature, temperatures, seeds, request_ids, steps, positions, controls }
        flashspec_verify_batch { struct_size, memory, num_requests, draft_offsets, draft_tokens, target_hidden, draft_logits, temperatures, draft_temperatures, seeds, request_ids, steps, accept_uniforms, max_draft_len, controls, draft_controls, logprobs, top_logprobs, draft_parents, draft_support_offsets, draft_support_tokens, draft_support_probs, greedy }
        flashspec_verify_result { struct_size, memory, accepted_counts, emitted_tokens, next_steps, logprobs, raw_logprobs, top_tokens, top_logprobs, accepted_nodes }
        flashspec_ngram_params { struct_size, min_n, max_n, call_cost, token_cost }
        flashspec_suffix_params { struct_size, max_match_len, max_depth, min_probability, cache_max_tokens, call_cost, token_cost, propose_trees }
        flashspec_draft_call { struct_size, context, context_len, drafted, num_drafted, max_tokens, step, tokens, num_tokens, logits, hidden, parents }
        flashspec_callback_drafter_params { struct_size, kind, draft, user_data, draft_temperature, head, call_cost, token_cost }
        flashspec_target_call { struct_size, tokens, num_tokens, num_past, num_rows, step, hidden, parents }
        flashspec_arm { drafter, draft_len }
        flashspec_engine_params { struct_size, target_forward, target_rollback, target_user_data, drafters, num_drafters, arms, num_arms, default_draft_len, policy, bandit_seed, ucb_exploration, fixed_arm, oracle_rewards, target_step_cost, target_row_cost, max_context, draft_len_memory, draft_len_rule, target_keep }
        flashspec_generate_params { struct_size, temperature, seed, request_id, max_tokens, stop_tokens, num_stop_tokens, on_token, on_token_user_data }
        flashspec_generate_result { struct_size, num_tokens, finish_reason, steps }
        flashspec_engine_metrics { struct_size, steps, drafts, draft_tokens, accepted_tokens, emitted_tokens, acceptance_rate, mean_accepted_length, tokens_per_step, step_latency_p50_us, step_latency_p99_us, num_positions, num_arms }
        flashspec_arm_metrics { struct_size, drafter, draft_len, pulls, draft_tokens, accepted_tokens, mean_reward, mean_cost }
        flashspec_batch_target_call { struct_size, num_sequences, sequence_ids, num_past, token_offsets, tokens, row_offsets, num_tokens, num_rows, step, hidden, parents }
        flashspec_batch_engine_params { struct_size, target_forward, target_rollback, target_user_data, num_drafters, arms, num_arms, default_draft_len, policy, bandit_seed, ucb_exploration, fixed_arm, oracle_rewards, target_step_cost, target_row_cost, max_context, max_sequences, draft_len_memory, draft_len_rule, target_keep }
        flashspec_sequence_params { struct_size, drafters, num_drafters, temperature, seed, request_id, max_tokens, stop_tokens, num_stop_tokens, on_token, on_token_user_data }
        flashspec_sequence_info { struct_size, active, status, finish_reason, num_tokens, steps }
        flashspec_api { struct_size, abi_version, version_number, version_string, status_string, context_params_init, context_create, context_destroy, context_last_error, context_synchronize, lm_head_create, lm_head_destroy, draft_params_init, draft, verify_batch_init, verify_result_init, summaries_create, summaries_destroy, verify, finalize, verify_and_finalize, ngram_params_init, drafter_create_ngram, callback_drafter_params_init, drafter_create_callback, drafter_destroy, engine_params_init, engine_create, engine_destroy, generate_params_init, generate_result_init, engine_generate, engine_cancel, engine_metrics_init, engine_get_metrics, engine_get_position_metrics, arm_metrics_init, engine_get_arm_metrics, engine_reset_metrics, abi_version_of_library, status_name, tensor_make, context_last_cuda_error, context_backend, cuda_device_count, lm_head_vocab_size, lm_head_hidden_size, philox4x32_10, rng_uniform, sampling_controls_init, draft_params_init_sized, verify_batch_init_sized, verify_result_init_sized, lm_head_create_shard, lm_head_vocab_begin, lm_head_global_vocab_size, verify_shard, finalize_shards, draft_shard, draft_from_shards, batch_engine_params_init, batch_engine_create, batch_engine_destroy, sequence_params_init, batch_engine_add_sequence, batch_engine_remove_sequence, batch_engine_step, sequence_info_init, batch_engine_get_sequence, batch_engine_sequence_error, batch_engine_get_metrics, batch_engine_get_sequence_metrics, batch_engine_get_arm_metrics, suffix_params_init, drafter_create_suffix, suffix_drafter_propose_tree, engine_params_init_sized, draft_top_k, lm_head_create_quantized, lm_head_dtype }
}

#[test]
fn struct_layouts_match_the_c_compiler() {
    let layouts = rust_layouts();
    // The list above names every header struct and field, in order.
    let header = header_structs(&header_code());
    for (name, fields) in &header {
        let listed = layouts.iter().find(|(n, _, _)| n == name).unwrap_or_else(|| panic!("{name} not in layouts!"));
        let header_fields: Vec<&str> = fields.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(listed.1, header_fields, "layouts! fields of {name}");
    }
    let mut program = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"flashspec.h\"\nint main(void) {\n");
    for (name, fields, _) in &layouts {
        program.push_str(&format!(
            "  printf(\"{name} %zu %zu\\n\", sizeof({name}), _Alignof({name}));\n"
        ));
        for f in fields {
            program.push_str(&format!("  printf(\"{name}.{f} %zu\\n\", offsetof({name}, {f}));\n"));
        }
    }
    program.push_str("  return 0;\n}\n");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (source, exe) = (dir.join("layout_probe.c"), dir.join("layout_probe"));
    std::fs::write(&source, program).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let include = header_path().parent().unwrap().to_path_buf();
    let status = Command::new(&cc)
        .args(["-std=c11", "-o"])
        .arg(&exe)
        .arg(&source)
        .arg(format!("-I{}", include.display()))
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(status.success(), "the layout probe did not compile");
    let c = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
    let rust: String = layouts.iter().map(|(_, _, r)| r.as_str()).collect();
    for (c_line, rust_line) in c.lines().zip(rust.lines()) {
        assert_eq!(rust_line, c_line, "layout differs (Rust left, C right)");
    }
    assert_eq!(c.lines().count(), rust.lines().count());
}
