"""What the PromQL in deploy/ may refer to: the metric names and label values gpukv-server exports, read from
its source so that a renamed metric or label value fails the checks instead of leaving a panel or an alert
silently empty. tests/deploy/test_monitoring_e2e.py checks the same queries against the running server."""
import re

from conftest import read

# Labels that Prometheus adds or that PromQL itself uses, not the server.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "le"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def _returns_of(source, signature):
    """The string literals a C++ function returns, from the function starting at `signature`."""
    start = source.index(signature)
    end = source.index("\n}", start)
    return set(re.findall(r'return "([A-Z_]+)";', source[start:end]))


def _names_in(source, signature):
    """The upper-case string literals in the C++ function starting at `signature` (a table of names)."""
    start = source.index(signature)
    end = source.index("\n}", start)
    return set(re.findall(r'"([A-Z_]+)"', source[start:end]))


def exported():
    """{metric name: {label: allowed values or None for any}} as the server registers them."""
    metrics_cpp = read("server", "service", "metrics.cpp")
    table_cpp = read("gpu", "src", "table.cpp")
    names = {}
    for builder, name in re.findall(r'Build(Counter|Gauge|Histogram)\(\)\s*\.Name\("(gpukv_\w+)"\)', metrics_cpp):
        names[name] = builder
    assert len(names) >= 10, f"found only {sorted(names)} in metrics.cpp"
    tiers = set(re.findall(r'\{"tier", "(\w+)"\}', metrics_cpp))
    labels = {
        ("gpukv_operations_total", "kind"): _returns_of(table_cpp, "const char* to_string(OpKind"),
        ("gpukv_operations_total", "result"): _returns_of(table_cpp, "const char* to_string(OpStatus"),
        ("gpukv_requests_total", "code"): _names_in(metrics_cpp, "const char* status_code_name("),
        ("gpukv_requests_total", "method"): None,
        ("gpukv_items", "tier"): tiers,
        ("gpukv_capacity_slots", "tier"): tiers,
        ("gpukv_host_tier_accesses_total", "kind"): set(re.findall(r'host_accesses_\.Add\(\{\{"kind", "(\w+)"\}\}\)',
                                                                   metrics_cpp)),
    }
    series = {}
    for name, builder in names.items():
        own = {label: values for (metric, label), values in labels.items() if metric == name}
        if builder == "Histogram":
            for suffix in HISTOGRAM_SUFFIXES:
                series[name + suffix] = dict(own)
        else:
            series[name] = own
    series["up"] = {}
    return series


SELECTOR = re.compile(r'\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?')
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
# Words in PromQL that look like metric names but are functions, keywords or aggregation modifiers.
PROMQL_WORDS = {"sum", "rate", "irate", "increase", "histogram_quantile", "by", "without", "on", "ignoring",
                "group_left", "group_right", "and", "or", "unless", "max", "min", "avg", "count", "deriv",
                "absent", "bool", "offset", "topk", "bottomk", "clamp_min", "clamp_max", "label_values"}


def check_expression(expr, series):
    """Problems with one PromQL expression's metric names and label values (an empty list when none)."""
    problems = []
    for name, matchers in SELECTOR.findall(re.sub(r"\[[^\]]*\]", "", expr)):  # ranges dropped
        if name in PROMQL_WORDS or name in TARGET_LABELS or not re.match(r"[a-z]", name) or name.isdigit():
            continue
        if not (name.startswith("gpukv_") or name == "up"):
            # Label names inside by (...) reach here too; only gpukv_ metrics and up are metric names.
            continue
        if name not in series:
            problems.append(f"{name}: the server exports no such metric")
            continue
        for label, op, value in MATCHER.findall(matchers or ""):
            if label in TARGET_LABELS:
                continue
            if label not in series[name]:
                problems.append(f"{name}: no label {label}")
                continue
            allowed = series[name][label]
            if allowed is None:
                continue
            values = value.split("|") if op in ("=~", "!~") else [value]
            unknown = [v for v in values if v not in allowed]
            if unknown:
                problems.append(f"{name}{{{label}}}: {unknown} not among {sorted(allowed)}")
    return problems
