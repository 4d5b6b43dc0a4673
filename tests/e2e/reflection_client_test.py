#!/usr/bin/env python3
"""A generic gRPC client that knows lmserve's API only through server reflection.

It uses Debian's python3-grpcio and python3-protobuf, with the reflection protocol's definition from
Debian's grpc-proto package compiled by protoc at test time: it lists the server's services, fetches
lmserve.v1's descriptors, builds the message classes from them and calls GetModelInfo and
CompleteStream.
"""

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402

GRPC_PROTO_DIR = "/usr/share/grpc-proto"
REFLECTION_PROTO = "grpc/reflection/v1alpha/reflection.proto"


def reflection_module(work_dir):
    subprocess.run(["protoc", f"--proto_path={GRPC_PROTO_DIR}", f"--python_out={work_dir}",
                    REFLECTION_PROTO], check=True)
    # Loaded from its file: the package name "grpc" is grpcio's.
    path = os.path.join(work_dir, REFLECTION_PROTO.replace(".proto", "_pb2.py"))
    spec = importlib.util.spec_from_file_location("lmserve_reflection_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--fixtures-dir", required=True)
    args = parser.parse_args()
    try:
        import grpc  # pylint: disable=import-outside-toplevel
        from google.protobuf import descriptor_pb2, descriptor_pool  # pylint: disable=import-outside-toplevel
        from google.protobuf import message_factory  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        print(f"FAIL: {e} (scripts/setup.sh installs python3-grpcio and python3-protobuf)")
        return 1
    if not os.path.exists(os.path.join(GRPC_PROTO_DIR, REFLECTION_PROTO)):
        print("FAIL: grpc-proto is missing (scripts/setup.sh installs it)")
        return 1
    work_dir = tempfile.mkdtemp(prefix="lmserve-reflection-")
    reflection_pb2 = reflection_module(work_dir)

    server = e2e_util.Server(args.build_dir, ["--model", e2e_util.fixture_model(args.fixtures_dir),
                                              "--kv-cache-mb", "16"])
    failures = []
    checks = 0
    try:
        channel = grpc.insecure_channel(server.address)
        reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)

        def ask(**fields):
            responses = list(reflect(iter([reflection_pb2.ServerReflectionRequest(**fields)]),
                                     timeout=30))
            return responses[0]

        services = [s.name for s in ask(list_services="").list_services_response.service]
        checks += 1
        for name in ("lmserve.v1.Lmserve", "grpc.health.v1.Health"):
            if name not in services:
                failures.append(f"{name} is not listed: {services}")

        # The descriptors of lmserve.v1.Lmserve, with their dependencies, into a fresh pool.
        pool = descriptor_pool.DescriptorPool()
        pending = list(ask(file_containing_symbol="lmserve.v1.Lmserve")
                       .file_descriptor_response.file_descriptor_proto)
        added = set()
        while pending:
            proto = descriptor_pb2.FileDescriptorProto.FromString(pending.pop())
            if proto.name in added:
                continue
            missing = [d for d in proto.dependency if d not in added]
            if missing:
                pending.insert(0, proto.SerializeToString())
                for dependency in missing:
                    pending.extend(ask(file_by_filename=dependency)
                                   .file_descriptor_response.file_descriptor_proto)
                continue
            pool.Add(proto)
            added.add(proto.name)
        service = pool.FindServiceByName("lmserve.v1.Lmserve")
        methods = {m.name: m for m in service.methods}
        checks += 1
        for name in ("Complete", "CompleteStream", "Chat", "ChatStream", "Tokenize", "Detokenize",
                     "GetModelInfo", "GetServerStatus"):
            if name not in methods:
                failures.append(f"method {name} is missing: {sorted(methods)}")

        def message_class(descriptor):
            if hasattr(message_factory, "GetMessageClass"):
                return message_factory.GetMessageClass(descriptor)
            return message_factory.MessageFactory(pool).GetPrototype(descriptor)

        def stub(method, streaming):
            request_class = message_class(method.input_type)
            response_class = message_class(method.output_type)
            path = f"/{service.full_name}/{method.name}"
            make = channel.unary_stream if streaming else channel.unary_unary
            return request_class, make(path, request_serializer=request_class.SerializeToString,
                                       response_deserializer=response_class.FromString)

        request_class, get_model_info = stub(methods["GetModelInfo"], False)
        info = get_model_info(request_class(), timeout=30)
        checks += 1
        if info.name != "llama-gqa" or info.vocab_size != 1024:
            failures.append(f"GetModelInfo: {info}")

        request_class, complete_stream = stub(methods["CompleteStream"], True)
        request = request_class()
        request.token_ids.ids.extend([1, 2, 3])
        request.sampling.max_tokens = 6
        request.sampling.temperature = 0
        request.sampling.ignore_eos = True
        tokens = []
        finish = None
        for message in complete_stream(request, timeout=30):
            tokens.extend(message.token_ids)
            if message.finish_reason:
                finish = message.DESCRIPTOR.fields_by_name["finish_reason"].enum_type \
                    .values_by_number[message.finish_reason].name
        checks += 1
        if len(tokens) != 6 or finish != "FINISH_REASON_LENGTH":
            failures.append(f"CompleteStream: tokens {tokens}, finish {finish}")
    finally:
        server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    for failure in failures:
        print("FAIL:", failure)
    print(f"{checks - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
