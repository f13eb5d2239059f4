"""Repository conftest: the example host trees and benchmark scripts are not test modules."""

collect_ignore = ["examples", "bench"]
