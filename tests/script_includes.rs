//! The scripts' preludes are included by `--#include <file>` lines, replaced where they
//! stand (`src/wire/scripts.rs`, `docs/protocol.md` 2.0). A line of any other spelling
//! stays a Lua comment, and the helpers it meant to bring would be nil on every path that
//! uses them; this checks the texts as the client sends them (from the adversary's review
//! of the change, which also ran the scripts as composed before and after it side by side
//! on two servers over 50,000 generated cases and found them to agree).

/// The files of `lua/` that scripts include.
const PRELUDES: [&str; 4] = [
    "lock_shape.lua",
    "line.lua",
    "published.lua",
    "count_shape.lua",
];

/// Every script's text has its preludes in place, each at most once; no line that looks
/// like an include of another spelling (`-- #include`, an indented one, a tab) stays
/// behind as a comment, which would leave its helpers nil on the paths that use them;
/// every prelude ends its last line (else the script's next line would join it, a
/// comment's); and no script defines a name a prelude defines: included after the
/// script's own definition, the prelude's would now win where the script's did.
#[test]
fn every_include_is_replaced_once() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
    let read = |file: &str| std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
    let mut defined = Vec::new();
    for prelude in PRELUDES {
        let text = read(prelude);
        assert!(text.ends_with('\n'), "{prelude} ends without a newline");
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("local ") {
                let rest = rest.strip_prefix("function ").unwrap_or(rest);
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                defined.push(name);
            }
        }
    }
    assert!(defined.len() >= 10, "{defined:?}");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if PRELUDES.contains(&name.as_str()) {
            continue;
        }
        let raw = read(&name);
        let text = redis_rlock::protocol::script_source(&name).expect("a script");
        for line in raw.lines().filter(|l| l.contains("#include")) {
            let file = line.trim_end().strip_prefix("--#include ");
            assert!(
                file.is_some_and(|f| PRELUDES.contains(&f)),
                "{name}: {line:?} is no include compose() replaces"
            );
            seen += 1;
        }
        assert!(!text.contains("#include"), "{name} keeps an include line");
        for helper in &defined {
            let n = text.matches(&format!("local function {helper}(")).count();
            assert!(n <= 1, "{name} defines {helper} {n} times");
            for line in raw.lines().map(str::trim_start) {
                let own = line
                    .strip_prefix("local ")
                    .map(|r| r.strip_prefix("function ").unwrap_or(r));
                let clash = own.is_some_and(|r| {
                    r.strip_prefix(helper.as_str()).is_some_and(|after| {
                        !after.starts_with(|c: char| c.is_alphanumeric() || c == '_')
                    })
                });
                assert!(
                    !clash,
                    "{name} defines {helper}, as a prelude does: {line:?}"
                );
            }
        }
    }
    assert!(seen >= 20, "only {seen} include lines found");
}
