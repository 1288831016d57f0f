class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8, 16]", target: "f32[8, 8]", w1: "f32[32, 16]", b1: "f32[32]", w2: "f32[8, 32]", b2: "f32[8]"):
        # File: python/oracle/dist_capture.py:96 in forward, code: h = torch.relu(torch.matmul(x, w1.t()) + b1)  # fc1, column parallel
        t: "f32[16, 32]" = torch.ops.aten.t.default(w1);  w1 = None
        matmul: "f32[8, 32]" = torch.ops.aten.matmul.default(x, t);  x = t = None
        add: "f32[8, 32]" = torch.ops.aten.add.Tensor(matmul, b1);  matmul = b1 = None
        relu: "f32[8, 32]" = torch.ops.aten.relu.default(add);  add = None

        # File: python/oracle/dist_capture.py:97 in forward, code: y = torch.matmul(h, w2.t())  # fc2, row parallel: a partial sum on every tp rank
        t_1: "f32[32, 8]" = torch.ops.aten.t.default(w2);  w2 = None
        matmul_1: "f32[8, 8]" = torch.ops.aten.matmul.default(relu, t_1);  relu = t_1 = None

        # File: python/oracle/dist_capture.py:103 in forward, code: y = y + b2
        add_1: "f32[8, 8]" = torch.ops.aten.add.Tensor(matmul_1, b2);  matmul_1 = b2 = None

        # File: python/oracle/dist_capture.py:104 in forward, code: loss = torch.mean((y - target) ** 2)
        sub: "f32[8, 8]" = torch.ops.aten.sub.Tensor(add_1, target);  add_1 = target = None
        pow_1: "f32[8, 8]" = torch.ops.aten.pow.Tensor_Scalar(sub, 2);  sub = None
        loss: "f32[]" = torch.ops.aten.mean.default(pow_1);  pow_1 = None
        return (loss,)
