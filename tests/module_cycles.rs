//! No module cycles in `src/`: the lower layer must not know the upper one's types or names.
//!
//! Run alone with `cargo test --test module_cycles`.
//!
//! The check parses every file of the library (`src/`, but not `src/main.rs`, the binary's own
//! crate root) with `syn`, builds the graph of which file uses which, and fails listing every
//! cycle with the `file:line` of each edge that makes it.
//!
//! **Granularity.** A node is a file: `src/queue/model.rs` is `queue::model`, `src/queue/mod.rs`
//! is `queue`. Inline modules (`mod tests { .. }`) belong to their file, test code included.
//! An edge is a path in the code that names another file's module or item: `use` trees, paths
//! in types and expressions, paths in macro and attribute arguments; `crate::`, `super::`,
//! `self::` and names brought in by a `use`. A name is followed through re-exports (`pub use`,
//! globs and private `use` alike) to the file that defines it, so `super::OrderStatus` in
//! `queue/eligibility.rs` is an edge to `queue::model` when `queue/mod.rs` says
//! `pub use model::*`.
//!
//! Every edge counts except one from a module to its own descendant: a parent declares,
//! re-exports and orchestrates its children (`mod model; pub use model::*;`), and its children
//! may use the parent's items (`super::Queue`) without that being a loop. A child's edge to its
//! parent does count, so a loop that passes through a parent (`wire` → `queue::output` →
//! `queue` → `wire`) is found, as is one between siblings or across trees.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// One module: a file, or an inline `mod x { .. }` inside one.
struct Node {
    path: Vec<String>,
    file: usize,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// `use` bindings: the name in scope → the path it stands for.
    bindings: BTreeMap<String, Vec<String>>,
    globs: Vec<Vec<String>>,
    /// Names of the items defined here (fns, types, consts, macros, ..).
    defined: BTreeSet<String>,
    /// Paths written here, with their line.
    refs: Vec<(Vec<String>, usize)>,
}

/// The library's modules, parsed.
struct Tree {
    files: Vec<String>,
    nodes: Vec<Node>,
    /// `#[macro_export]` macros: named at the crate root, defined in these modules.
    exported_macros: BTreeMap<String, usize>,
}

/// An edge between two files, with the line of its first occurrence.
type Edges = BTreeMap<(usize, usize), usize>;

fn module_path(file: &str) -> Vec<String> {
    let rel = file.strip_suffix(".rs").expect("a .rs file");
    let mut path: Vec<String> = rel.split('/').map(str::to_owned).collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
        path.pop();
    }
    path
}

impl Tree {
    /// Parses `files` (path relative to `src/`, source text) into one module tree.
    fn parse(sources: &[(String, String)]) -> Tree {
        let mut tree = Tree {
            files: Vec::new(),
            nodes: Vec::new(),
            exported_macros: BTreeMap::new(),
        };
        let mut by_path: BTreeMap<Vec<String>, usize> = BTreeMap::new();
        // Files first, parents before children, so that every file node exists when its
        // contents are walked.
        let mut sorted: Vec<&(String, String)> = sources.iter().collect();
        sorted.sort_by_key(|(f, _)| (module_path(f).len(), f.clone()));
        for (file, _) in &sorted {
            let path = module_path(file);
            let parent = (!path.is_empty()).then(|| by_path[&path[..path.len() - 1]]);
            let id = tree.add(path.clone(), tree.files.len(), parent);
            tree.files.push(format!("src/{file}"));
            by_path.insert(path, id);
        }
        for (file, text) in &sorted {
            let ast = syn::parse_file(text).unwrap_or_else(|e| panic!("src/{file}: {e}"));
            let id = by_path[&module_path(file)];
            let mut walker = Walker {
                tree: &mut tree,
                stack: vec![id],
            };
            walker.define(&ast.items);
            walker.visit_file(&ast);
        }
        tree
    }

    fn add(&mut self, path: Vec<String>, file: usize, parent: Option<usize>) -> usize {
        let id = self.nodes.len();
        if let Some(p) = parent {
            self.nodes[p]
                .children
                .insert(path.last().cloned().unwrap_or_default(), id);
        }
        self.nodes.push(Node {
            path,
            file,
            parent,
            children: BTreeMap::new(),
            bindings: BTreeMap::new(),
            globs: Vec::new(),
            defined: BTreeSet::new(),
            refs: Vec::new(),
        });
        id
    }

    /// The module a path written in `scope` names, or `None` when it leaves the crate (another
    /// crate, the prelude, a local). `Some((node, sure))`: `sure` is false when the last name
    /// was not found and the module it was looked up in is assumed to define it.
    fn resolve(&self, scope: usize, segs: &[String], depth: usize) -> Option<(usize, bool)> {
        if depth > 32 || segs.is_empty() {
            return None;
        }
        let first = segs[0].as_str();
        match first {
            "crate" => self.walk(0, &segs[1..], depth),
            "self" => self.walk(scope, &segs[1..], depth),
            "super" => self.walk(scope, segs, depth),
            _ => {
                if let Some(&child) = self.nodes[scope].children.get(first) {
                    return self.walk(child, &segs[1..], depth);
                }
                if let Some(target) = self.nodes[scope].bindings.get(first) {
                    let full: Vec<String> = target.iter().chain(&segs[1..]).cloned().collect();
                    return self.resolve(scope, &full, depth + 1);
                }
                // Through a glob only a type-like name or a longer path: a single lower-case
                // name is most often a local variable.
                let type_like = first.starts_with(char::is_uppercase) || segs.len() > 1;
                if type_like {
                    return self.through_globs(scope, segs, depth);
                }
                None
            }
        }
    }

    fn walk(&self, mut cur: usize, rest: &[String], depth: usize) -> Option<(usize, bool)> {
        for (i, seg) in rest.iter().enumerate() {
            let node = &self.nodes[cur];
            if seg == "super" {
                cur = node.parent?;
            } else if let Some(&child) = node.children.get(seg) {
                cur = child;
            } else if let Some(target) = node.bindings.get(seg) {
                let full: Vec<String> = target.iter().chain(&rest[i + 1..]).cloned().collect();
                return self.resolve(cur, &full, depth + 1);
            } else if let Some(&home) = self.exported_macros.get(seg).filter(|_| cur == 0) {
                return Some((home, true));
            } else if node.defined.contains(seg) {
                return Some((cur, true));
            } else {
                return self
                    .through_globs(cur, &rest[i..], depth)
                    .or(Some((cur, false)));
            }
        }
        Some((cur, true))
    }

    fn through_globs(&self, scope: usize, segs: &[String], depth: usize) -> Option<(usize, bool)> {
        self.nodes[scope].globs.iter().find_map(|glob| {
            let full: Vec<String> = glob.iter().chain(segs).cloned().collect();
            self.resolve(scope, &full, depth + 1)
                .filter(|&(_, sure)| sure)
        })
    }

    fn is_descendant(&self, node: usize, of: usize) -> bool {
        let (a, b) = (&self.nodes[node].path, &self.nodes[of].path);
        a.len() > b.len() && a.starts_with(b)
    }

    /// The file graph: every resolved reference between two files, except from a module to its
    /// own descendant.
    fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for (id, node) in self.nodes.iter().enumerate() {
            for (segs, line) in &node.refs {
                let Some((target, _)) = self.resolve(id, segs, 0) else {
                    continue;
                };
                // Files are the first nodes, in order: a file's node id is its file id.
                let (from, to) = (node.file, self.nodes[target].file);
                if from == to || self.is_descendant(to, from) {
                    continue;
                }
                let first = edges.entry((from, to)).or_insert(*line);
                *first = (*first).min(*line);
            }
        }
        edges
    }

    fn name(&self, file: usize) -> String {
        match self.nodes[file].path.join("::") {
            p if p.is_empty() => "crate".to_owned(),
            p => p,
        }
    }
}

/// Walks one file, keeping the module stack of its inline modules.
struct Walker<'a> {
    tree: &'a mut Tree,
    stack: Vec<usize>,
}

impl Walker<'_> {
    fn current(&mut self) -> &mut Node {
        let id = *self.stack.last().expect("in a module");
        &mut self.tree.nodes[id]
    }

    fn define(&mut self, items: &[syn::Item]) {
        for item in items {
            let name = match item {
                syn::Item::Const(i) => Some(&i.ident),
                syn::Item::Enum(i) => Some(&i.ident),
                syn::Item::Fn(i) => Some(&i.sig.ident),
                syn::Item::Macro(i) => i.ident.as_ref(),
                syn::Item::Static(i) => Some(&i.ident),
                syn::Item::Struct(i) => Some(&i.ident),
                syn::Item::Trait(i) => Some(&i.ident),
                syn::Item::TraitAlias(i) => Some(&i.ident),
                syn::Item::Type(i) => Some(&i.ident),
                syn::Item::Union(i) => Some(&i.ident),
                _ => None,
            };
            if let Some(name) = name {
                self.current().defined.insert(name.to_string());
            }
            if let syn::Item::Macro(m) = item
                && let Some(name) = &m.ident
                && m.attrs.iter().any(|a| a.path().is_ident("macro_export"))
            {
                let home = *self.stack.last().expect("in a module");
                self.tree.exported_macros.insert(name.to_string(), home);
            }
        }
    }

    fn record(&mut self, segs: Vec<String>, line: usize) {
        if !segs.is_empty() {
            self.current().refs.push((segs, line));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let target = if name == "self" {
                    prefix.clone()
                } else {
                    extend(prefix, &name)
                };
                let bound = target.last().cloned().unwrap_or_default();
                self.bind(bound, target, n.ident.span().start().line);
            }
            syn::UseTree::Rename(r) => {
                let name = r.ident.to_string();
                let target = if name == "self" {
                    prefix.clone()
                } else {
                    extend(prefix, &name)
                };
                self.bind(r.rename.to_string(), target, r.ident.span().start().line);
            }
            syn::UseTree::Glob(g) => {
                self.current().globs.push(prefix.clone());
                self.record(prefix.clone(), g.star_token.spans[0].start().line);
            }
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(prefix, t)),
        }
    }

    fn bind(&mut self, name: String, target: Vec<String>, line: usize) {
        self.current().bindings.insert(name, target.clone());
        self.record(target, line);
    }

    /// Paths inside a macro's or an attribute's tokens: every `a::b::c` run of identifiers.
    fn tokens(&mut self, tokens: TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut line = 0;
        let mut colons = 0;
        for tt in tokens {
            match tt {
                TokenTree::Ident(i) if run.is_empty() || colons == 2 => {
                    if run.is_empty() {
                        line = i.span().start().line;
                    }
                    run.push(i.to_string());
                    colons = 0;
                }
                TokenTree::Punct(p) if p.as_char() == ':' && !run.is_empty() && colons < 2 => {
                    colons += 1;
                }
                other => {
                    self.flush(&mut run, line);
                    colons = 0;
                    if let TokenTree::Group(g) = other {
                        self.tokens(g.stream());
                    } else if let TokenTree::Ident(i) = other {
                        line = i.span().start().line;
                        run.push(i.to_string());
                    }
                }
            }
        }
        self.flush(&mut run, line);
    }

    fn flush(&mut self, run: &mut Vec<String>, line: usize) {
        // A lone name in a macro (`format!("{x}", x = y)`) is far more often a local than an
        // item: only paths count here.
        if run.len() > 1 {
            self.record(std::mem::take(run), line);
        }
        run.clear();
    }
}

fn extend(prefix: &[String], name: &str) -> Vec<String> {
    prefix.iter().cloned().chain([name.to_owned()]).collect()
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let Some((_, items)) = &m.content else { return };
        let parent = *self.stack.last().expect("in a module");
        let mut path = self.tree.nodes[parent].path.clone();
        path.push(m.ident.to_string());
        let file = self.tree.nodes[parent].file;
        let id = self.tree.add(path, file, Some(parent));
        self.stack.push(id);
        self.define(items);
        m.attrs.iter().for_each(|a| self.visit_attribute(a));
        items.iter().for_each(|i| self.visit_item(i));
        self.stack.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_none() {
            self.use_tree(&mut Vec::new(), &u.tree);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let segs = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.record(segs, p.segments[0].ident.span().start().line);
        }
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }

    fn visit_attribute(&mut self, a: &'ast syn::Attribute) {
        if a.path().is_ident("doc") {
            return;
        }
        if let syn::Meta::List(list) = &a.meta {
            self.tokens(list.tokens.clone());
        } else {
            visit::visit_attribute(self, a);
        }
    }
}

/// The cycles of a graph: for each strongly connected component with more than one node, the
/// shortest cycle through each of its nodes, each cycle once (starting at its smallest node).
fn cycles(nodes: usize, edges: &BTreeSet<(usize, usize)>) -> Vec<Vec<usize>> {
    let mut out = BTreeSet::new();
    let next = |u: usize| edges.range((u, 0)..(u + 1, 0)).map(|&(_, v)| v);
    for start in 0..nodes {
        // Shortest path from `start` back to itself.
        let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        let mut found = false;
        while let Some(u) = queue.pop_front() {
            for v in next(u) {
                if v == start {
                    prev.insert(start, u);
                    found = true;
                    break;
                }
                if let std::collections::btree_map::Entry::Vacant(e) = prev.entry(v) {
                    e.insert(u);
                    queue.push_back(v);
                }
            }
            if found {
                break;
            }
        }
        if !found {
            continue;
        }
        let mut cycle = vec![start];
        let mut at = prev[&start];
        while at != start {
            cycle.push(at);
            at = prev[&at];
        }
        cycle.reverse();
        cycle.rotate_right(1);
        let min = cycle
            .iter()
            .enumerate()
            .min_by_key(|&(_, n)| n)
            .map(|(i, _)| i)
            .unwrap_or(0);
        cycle.rotate_left(min);
        out.insert(cycle);
    }
    out.into_iter().collect()
}

fn sources(root: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("read src")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root)
                    .expect("under src")
                    .to_string_lossy()
                    .into_owned();
                if rel != "main.rs" {
                    out.push((rel, std::fs::read_to_string(&path).expect("read file")));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

/// Each cycle as `a → b (file:line) → .. → a (file:line)`.
fn describe(tree: &Tree, edges: &Edges) -> Vec<String> {
    let set: BTreeSet<(usize, usize)> = edges.keys().copied().collect();
    cycles(tree.files.len(), &set)
        .into_iter()
        .map(|cycle| {
            let mut text = tree.name(cycle[0]);
            for (i, &from) in cycle.iter().enumerate() {
                let to = cycle[(i + 1) % cycle.len()];
                let line = edges[&(from, to)];
                text += &format!(" → {} ({}:{line})", tree.name(to), tree.files[from]);
            }
            text
        })
        .collect()
}

#[test]
fn no_module_cycles_in_src() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let tree = Tree::parse(&sources(&src));
    let edges = tree.edges();
    eprintln!("{} edges between {} files", edges.len(), tree.files.len());
    // A parser or resolver that finds nothing would pass vacuously.
    assert!(
        edges.len() > 100,
        "only {} edges between files found in src/",
        edges.len()
    );
    let known = |from: &str, to: &str| {
        let id = |name: &str| (0..tree.files.len()).find(|&f| tree.name(f) == name);
        edges.contains_key(&(id(from).expect(from), id(to).expect(to)))
    };
    assert!(known("serve", "api"), "serve → api not found");
    assert!(
        known("queue::waiting", "queue::eligibility"),
        "waiting → eligibility not found"
    );
    let found = describe(&tree, &edges);
    assert!(
        found.is_empty(),
        "{} module cycle(s) in src/ (the lower layer must not know the upper one's names; \
         move the shared item down):\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_cycle_finder_finds_each_loop_once() {
    // a → b → c → a, c → d, d → e → d, and f alone.
    let edges: BTreeSet<(usize, usize)> = [(0, 1), (1, 2), (2, 0), (2, 3), (3, 4), (4, 3), (5, 0)]
        .into_iter()
        .collect();
    assert_eq!(cycles(6, &edges), vec![vec![0, 1, 2], vec![3, 4]]);
    let acyclic: BTreeSet<(usize, usize)> = [(0, 1), (1, 2), (0, 2)].into_iter().collect();
    assert!(cycles(3, &acyclic).is_empty());
}

#[test]
fn loops_through_reexports_and_parents_are_found_and_a_parent_over_its_children_is_not() {
    let files = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect()
    };
    let src = files(&[
        ("lib.rs", "pub mod out; pub mod q; pub mod wire;"),
        // A macro exported at the crate root is an edge to the file that defines it.
        ("out.rs", "#[macro_export] macro_rules! say { () => {} }"),
        // The parent re-exports and uses its children: not an edge.
        (
            "q/mod.rs",
            "mod model; mod waiting; pub use model::*; use waiting::why; pub struct Queue;",
        ),
        // model → waiting through a fully-qualified path in a field type.
        (
            "q/model.rs",
            "pub enum Status { A } pub struct Order { w: super::waiting::Why }",
        ),
        // waiting → model through the parent's glob re-export, and waiting → q for `Queue`.
        (
            "q/waiting.rs",
            "use super::{Status, Queue}; pub struct Why; pub fn why() {}",
        ),
        // wire → q::waiting by `use`; nothing comes back.
        (
            "wire.rs",
            "use crate::q::waiting::Why; fn f() { let _ = format!(\"{}\", crate::q::Queue); }\n\
             fn g() { crate::say!(); }",
        ),
    ]);
    let tree = Tree::parse(&src);
    let edges = tree.edges();
    let named: BTreeSet<(String, String, usize)> = edges
        .iter()
        .map(|(&(f, t), &l)| (tree.name(f), tree.name(t), l))
        .collect();
    let e = |f: &str, t: &str, l: usize| (f.to_owned(), t.to_owned(), l);
    let expected: BTreeSet<_> = [
        e("q::model", "q::waiting", 1),
        e("q::waiting", "q::model", 1),
        e("q::waiting", "q", 1),
        e("wire", "q::waiting", 1),
        e("wire", "q", 1),
        e("wire", "out", 2),
    ]
    .into_iter()
    .collect();
    assert_eq!(named, expected);
    let found = describe(&tree, &edges);
    assert_eq!(
        found,
        vec!["q::model → q::waiting (src/q/model.rs:1) → q::model (src/q/waiting.rs:1)"]
    );
}
