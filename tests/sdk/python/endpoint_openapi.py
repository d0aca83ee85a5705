"""Checks an endpoint's OpenAPI document with tools no one here wrote.

1. Validates it with openapi-spec-validator (OpenAPI 3.0 rules).
2. Generates a typed client with openapi-python-client, imports it, and runs the endpoint
   through it with the given variables.

Usage: endpoint_openapi.py <base_url> <spec_path> <api_key> <variables-json> <workdir>
Prints the run's JSON body.
"""

import importlib
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from openapi_spec_validator import validate


def main() -> None:
    base_url, spec_path, api_key, variables, workdir = sys.argv[1:6]
    req = urllib.request.Request(
        base_url + spec_path, headers={"Authorization": f"Bearer {api_key}"}
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        spec = json.load(res)
    validate(spec)

    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    spec_file = work / "openapi.json"
    spec_file.write_text(json.dumps(spec))
    generator = Path(sys.executable).parent / "openapi-python-client"
    subprocess.run(
        [str(generator), "generate", "--path", str(spec_file), "--meta", "none",
         "--output-path", str(work / "endpoint_client"), "--overwrite"],
        check=True, capture_output=True,
    )
    sys.path.insert(0, str(work))
    client_pkg = importlib.import_module("endpoint_client")
    operation = next(iter(spec["paths"].values()))["post"]["operationId"]
    run = importlib.import_module(f"endpoint_client.api.default.{operation}")
    models = importlib.import_module("endpoint_client.models")
    client = client_pkg.AuthenticatedClient(base_url=base_url, token=api_key)
    body = {"variables": json.loads(variables)} if variables != "null" else {}
    request = models.EndpointRunRequest.from_dict(body)
    response = run.sync_detailed(client=client, body=request)
    if response.status_code != 200:
        raise SystemExit(f"run failed: {response.status_code} {response.content!r}")
    parsed = response.parsed
    print(json.dumps({"results": parsed.results, "columns": parsed.columns,
                      "hasMore": parsed.has_more, "raw": json.loads(response.content)}))


if __name__ == "__main__":
    main()
