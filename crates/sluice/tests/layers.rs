//! The library's layers hold: a module imports only from its own layer and
//! the layers below it (docs/design.md, "The layers"). Read from the source,
//! so a new upward import fails here, not in review. No root needed.
use std::path::Path;

/// The layer folders of `src/`, lowest first.
const LAYERS: [(&str, u8); 6] =
    [("base", 0), ("policy", 1), ("signals", 2), ("dataplane", 3), ("surface", 4), ("daemon", 5)];

fn rank(layer: &str) -> Option<u8> {
    LAYERS.iter().find(|(l, _)| *l == layer).map(|(_, r)| *r)
}

/// Every `crate::LAYER` a file names outside comments, with its line number.
fn uses(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if rank(&name).is_some() {
                out.push((n + 1, name));
            }
        }
    }
    out
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_layer_imports_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (layer, r) in LAYERS {
        let mut fs = Vec::new();
        files(&src.join(layer), &mut fs);
        assert!(!fs.is_empty(), "src/{layer} has no files");
        for f in fs {
            checked += 1;
            for (line, to) in uses(&std::fs::read_to_string(&f).unwrap()) {
                let to_rank = rank(&to).unwrap();
                if to != layer && to_rank >= r {
                    wrong.push(format!("{}:{line}: {layer} imports {to}", f.strip_prefix(&src).unwrap().display()));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} files read");
    assert!(wrong.is_empty(), "imports against the layers:\n{}", wrong.join("\n"));
}

#[test]
fn the_check_sees_an_upward_import() {
    let text = "use crate::daemon::tick; // crate::surface in a comment\nlet x = crate::base::clock::now_ns();";
    assert_eq!(uses(text), vec![(1, "daemon".to_string()), (2, "base".to_string())]);
}
