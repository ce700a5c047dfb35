//! What xtask needs from `cargo metadata`: workspace crates, their features, bench targets and
//! declared dependencies, and the resolved dependency graph.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde_json::Value;

use crate::Result;
use crate::cmd::Cmd;

/// The workspace's own crates.
#[derive(Debug)]
pub(crate) struct Workspace {
    pub(crate) members: Vec<Package>,
}

/// One workspace crate, as its `Cargo.toml` declares it.
#[derive(Debug)]
pub(crate) struct Package {
    pub(crate) name: String,
    /// Feature name to what it enables; includes `default` when declared.
    pub(crate) features: BTreeMap<String, Vec<String>>,
    /// Names of `[[bench]]` targets.
    pub(crate) benches: Vec<String>,
    /// Declared dependencies, optional ones included.
    pub(crate) deps: Vec<Dep>,
}

/// A declared dependency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dep {
    /// The package name (not a `package = ...` rename).
    pub(crate) name: String,
    pub(crate) kind: DepKind,
    /// The features the dependency turns on, and whether its default features are on too.
    pub(crate) features: Vec<String>,
    pub(crate) default_features: bool,
}

/// The `Cargo.toml` table a dependency is declared in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DepKind {
    Normal,
    Build,
    Dev,
}

/// The resolved graph (all features on), keeping only normal and build edges.
#[derive(Debug)]
pub(crate) struct Graph {
    names: HashMap<String, String>,
    edges: HashMap<String, Vec<String>>,
}

impl Workspace {
    pub(crate) fn member(&self, name: &str) -> Option<&Package> {
        self.members.iter().find(|p| p.name == name)
    }
}

impl Package {
    pub(crate) fn has_feature(&self, feature: &str) -> bool {
        self.features.contains_key(feature)
    }

    /// The dev-dependency on the crate itself, if any: its tests build the crate with that
    /// dependency's features (and its defaults, unless it says `default-features = false`)
    /// whatever `cargo test` is asked for.
    pub(crate) fn self_dev_dep(&self) -> Option<&Dep> {
        self.deps
            .iter()
            .find(|d| d.kind == DepKind::Dev && d.name == self.name)
    }
}

impl Graph {
    /// Every package reachable from workspace crate `root` through normal and build
    /// dependencies, each with the path of package names that reaches it (root first).
    pub(crate) fn closure(&self, root: &str) -> Vec<Vec<String>> {
        let Some(start) = self
            .names
            .iter()
            .find(|(_, n)| *n == root)
            .map(|(id, _)| id)
        else {
            return Vec::new();
        };
        let mut parent: HashMap<&str, &str> = HashMap::new();
        let mut seen = BTreeSet::from([start.as_str()]);
        let mut queue = VecDeque::from([start.as_str()]);
        let mut paths = Vec::new();
        while let Some(id) = queue.pop_front() {
            for dep in self.edges.get(id).into_iter().flatten() {
                if seen.insert(dep) {
                    parent.insert(dep, id);
                    queue.push_back(dep);
                    paths.push(self.path_to(dep, &parent));
                }
            }
        }
        paths
    }

    fn path_to<'a>(&self, mut id: &'a str, parent: &HashMap<&'a str, &'a str>) -> Vec<String> {
        let mut path = vec![self.name(id)];
        while let Some(&up) = parent.get(id) {
            path.push(self.name(up));
            id = up;
        }
        path.reverse();
        path
    }

    fn name(&self, id: &str) -> String {
        self.names.get(id).cloned().unwrap_or_else(|| id.to_owned())
    }
}

/// The workspace crates only (`cargo metadata --no-deps`): fast, no dependency resolution.
pub(crate) fn workspace() -> Result<Workspace> {
    let json = load(&["--no-deps"])?;
    parse_workspace(&json)
}

/// The workspace crates and the graph resolved with every feature on, so that optional
/// dependencies count too.
pub(crate) fn with_graph() -> Result<(Workspace, Graph)> {
    let json = load(&["--all-features"])?;
    Ok((parse_workspace(&json)?, parse_graph(&json)?))
}

fn load(extra: &[&str]) -> Result<Value> {
    let out = Cmd::cargo()
        .args(["metadata", "--format-version", "1"])
        .args(extra.iter().copied())
        .read()?;
    Ok(serde_json::from_str(&out)?)
}

fn parse_workspace(json: &Value) -> Result<Workspace> {
    let member_ids: BTreeSet<&str> = array(json, "workspace_members")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut members = Vec::new();
    for pkg in array(json, "packages")? {
        if member_ids.contains(string(pkg, "id")?) {
            members.push(parse_package(pkg)?);
        }
    }
    Ok(Workspace { members })
}

fn parse_package(pkg: &Value) -> Result<Package> {
    let features = pkg["features"]
        .as_object()
        .ok_or("cargo metadata: package without `features`")?
        .iter()
        .map(|(name, enables)| (name.clone(), strings(enables)))
        .collect();
    let mut benches = Vec::new();
    for target in array(pkg, "targets")? {
        if strings(&target["kind"]).iter().any(|k| k == "bench") {
            benches.push(string(target, "name")?.to_owned());
        }
    }
    let mut deps = Vec::new();
    for dep in array(pkg, "dependencies")? {
        let kind = match dep["kind"].as_str() {
            None => DepKind::Normal,
            Some("build") => DepKind::Build,
            Some("dev") => DepKind::Dev,
            Some(other) => {
                return Err(format!("cargo metadata: unknown dependency kind `{other}`").into());
            }
        };
        deps.push(Dep {
            name: string(dep, "name")?.to_owned(),
            kind,
            features: strings(&dep["features"]),
            default_features: dep["uses_default_features"].as_bool().unwrap_or(true),
        });
    }
    Ok(Package {
        name: string(pkg, "name")?.to_owned(),
        features,
        benches,
        deps,
    })
}

fn parse_graph(json: &Value) -> Result<Graph> {
    let mut names = HashMap::new();
    for pkg in array(json, "packages")? {
        names.insert(
            string(pkg, "id")?.to_owned(),
            string(pkg, "name")?.to_owned(),
        );
    }
    let nodes = json["resolve"]["nodes"]
        .as_array()
        .ok_or("cargo metadata: no `resolve.nodes`")?;
    let mut edges = HashMap::new();
    for node in nodes {
        let mut out = Vec::new();
        for dep in array(node, "deps")? {
            let non_dev = array(dep, "dep_kinds")?
                .iter()
                .any(|k| k["kind"].as_str() != Some("dev"));
            if non_dev {
                out.push(string(dep, "pkg")?.to_owned());
            }
        }
        edges.insert(string(node, "id")?.to_owned(), out);
    }
    Ok(Graph { names, edges })
}

fn array<'a>(v: &'a Value, key: &str) -> Result<&'a Vec<Value>> {
    v[key]
        .as_array()
        .ok_or_else(|| format!("cargo metadata: missing array `{key}`").into())
}

fn string<'a>(v: &'a Value, key: &str) -> Result<&'a str> {
    v[key]
        .as_str()
        .ok_or_else(|| format!("cargo metadata: missing string `{key}`").into())
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closure_skips_dev_edges_and_records_paths() {
        let json: Value = serde_json::from_str(
            r#"{
              "workspace_members": ["m"],
              "packages": [
                {"id": "m", "name": "velo-mux", "features": {"test-util": []},
                 "targets": [{"kind": ["lib"], "name": "velo_mux"}, {"kind": ["bench"], "name": "batch"}],
                 "dependencies": [{"name": "bytes", "kind": null}, {"name": "proptest", "kind": "dev"}]},
                {"id": "b", "name": "bytes", "features": {}, "targets": [], "dependencies": []},
                {"id": "p", "name": "proptest", "features": {}, "targets": [], "dependencies": []},
                {"id": "l", "name": "libc", "features": {}, "targets": [], "dependencies": []}
              ],
              "resolve": {"nodes": [
                {"id": "m", "deps": [
                  {"pkg": "b", "dep_kinds": [{"kind": null}]},
                  {"pkg": "p", "dep_kinds": [{"kind": "dev"}]}]},
                {"id": "b", "deps": [{"pkg": "l", "dep_kinds": [{"kind": "build"}]}]},
                {"id": "p", "deps": []},
                {"id": "l", "deps": []}
              ]}
            }"#,
        )
        .expect("test JSON is valid");
        let ws = parse_workspace(&json).expect("workspace parses");
        let mux = ws.member("velo-mux").expect("velo-mux is a member");
        assert_eq!(mux.benches, ["batch"]);
        assert!(mux.has_feature("test-util"));
        assert_eq!(
            mux.deps[1],
            Dep {
                name: "proptest".into(),
                kind: DepKind::Dev,
                features: Vec::new(),
                default_features: true,
            }
        );
        let graph = parse_graph(&json).expect("graph parses");
        assert_eq!(
            graph.closure("velo-mux"),
            [vec!["velo-mux", "bytes"], vec!["velo-mux", "bytes", "libc"]]
        );
    }
}
