class <lambda>(torch.nn.Module):
    def forward(self, attention_norm_weight: "f32[8]", attention_wq_weight: "f32[8, 8]", attention_wk_weight: "f32[8, 8]", attention_wv_weight: "f32[8, 8]", attention_wo_weight: "f32[8, 8]", ffn_norm_weight: "f32[8]", feed_forward_w1_weight: "f32[16, 8]", feed_forward_w2_weight: "f32[8, 16]", feed_forward_w3_weight: "f32[16, 8]", norm_weight: "f32[8]", output_weight: "f32[8, 8]", x: "f32[2, 4, 8]"):
        # File: models.py:90 in forward, code: return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        pow_1: "f32[2, 4, 8]" = torch.ops.aten.pow.Tensor_Scalar(x, 2)
        mean: "f32[2, 4, 1]" = torch.ops.aten.mean.dim(pow_1, [-1], True);  pow_1 = None
        add: "f32[2, 4, 1]" = torch.ops.aten.add.Tensor(mean, 1e-06);  mean = None
        rsqrt: "f32[2, 4, 1]" = torch.ops.aten.rsqrt.default(add);  add = None
        mul: "f32[2, 4, 8]" = torch.ops.aten.mul.Tensor(x, rsqrt);  rsqrt = None
        mul_1: "f32[2, 4, 8]" = torch.ops.aten.mul.Tensor(mul, attention_norm_weight);  mul = attention_norm_weight = None

        # File: models.py:107 in forward, code: q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        t: "f32[8, 8]" = torch.ops.aten.t.default(attention_wq_weight);  attention_wq_weight = None
        view: "f32[8, 8]" = torch.ops.aten.view.default(mul_1, [8, 8])
        mm: "f32[8, 8]" = torch.ops.aten.mm.default(view, t);  view = t = None
        _unsafe_view: "f32[2, 4, 8]" = torch.ops.aten._unsafe_view.default(mm, [2, 4, 8]);  mm = None
        view_1: "f32[2, 4, 4, 2]" = torch.ops.aten.view.default(_unsafe_view, [2, 4, -1, 2]);  _unsafe_view = None
        transpose: "f32[2, 4, 4, 2]" = torch.ops.aten.transpose.int(view_1, 1, 2);  view_1 = None

        # File: models.py:108 in forward, code: k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        t_1: "f32[8, 8]" = torch.ops.aten.t.default(attention_wk_weight);  attention_wk_weight = None
        view_2: "f32[8, 8]" = torch.ops.aten.view.default(mul_1, [8, 8])
        mm_1: "f32[8, 8]" = torch.ops.aten.mm.default(view_2, t_1);  view_2 = t_1 = None
        _unsafe_view_1: "f32[2, 4, 8]" = torch.ops.aten._unsafe_view.default(mm_1, [2, 4, 8]);  mm_1 = None
        view_3: "f32[2, 4, 4, 2]" = torch.ops.aten.view.default(_unsafe_view_1, [2, 4, -1, 2]);  _unsafe_view_1 = None
        transpose_1: "f32[2, 4, 4, 2]" = torch.ops.aten.transpose.int(view_3, 1, 2);  view_3 = None

        # File: models.py:109 in forward, code: v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        t_2: "f32[8, 8]" = torch.ops.aten.t.default(attention_wv_weight);  attention_wv_weight = None
        view_4: "f32[8, 8]" = torch.ops.aten.view.default(mul_1, [8, 8]);  mul_1 = None
        mm_2: "f32[8, 8]" = torch.ops.aten.mm.default(view_4, t_2);  view_4 = t_2 = None
        _unsafe_view_2: "f32[2, 4, 8]" = torch.ops.aten._unsafe_view.default(mm_2, [2, 4, 8]);  mm_2 = None
        view_5: "f32[2, 4, 4, 2]" = torch.ops.aten.view.default(_unsafe_view_2, [2, 4, -1, 2]);  _unsafe_view_2 = None
        transpose_2: "f32[2, 4, 4, 2]" = torch.ops.aten.transpose.int(view_5, 1, 2);  view_5 = None

        # File: models.py:110 in forward, code: scores = q @ k.transpose(-2, -1) / self.head_dim**0.5
        transpose_3: "f32[2, 4, 2, 4]" = torch.ops.aten.transpose.int(transpose_1, -2, -1);  transpose_1 = None
        expand: "f32[2, 4, 4, 2]" = torch.ops.aten.expand.default(transpose, [2, 4, 4, 2]);  transpose = None
        clone: "f32[2, 4, 4, 2]" = torch.ops.aten.clone.default(expand, memory_format = torch.contiguous_format);  expand = None
        _unsafe_view_3: "f32[8, 4, 2]" = torch.ops.aten._unsafe_view.default(clone, [8, 4, 2]);  clone = None
        expand_1: "f32[2, 4, 2, 4]" = torch.ops.aten.expand.default(transpose_3, [2, 4, 2, 4]);  transpose_3 = None
        clone_1: "f32[2, 4, 2, 4]" = torch.ops.aten.clone.default(expand_1, memory_format = torch.contiguous_format);  expand_1 = None
        _unsafe_view_4: "f32[8, 2, 4]" = torch.ops.aten._unsafe_view.default(clone_1, [8, 2, 4]);  clone_1 = None
        bmm: "f32[8, 4, 4]" = torch.ops.aten.bmm.default(_unsafe_view_3, _unsafe_view_4);  _unsafe_view_3 = _unsafe_view_4 = None
        _unsafe_view_5: "f32[2, 4, 4, 4]" = torch.ops.aten._unsafe_view.default(bmm, [2, 4, 4, 4]);  bmm = None
        div: "f32[2, 4, 4, 4]" = torch.ops.aten.div.Tensor(_unsafe_view_5, 1.4142135623730951);  _unsafe_view_5 = None

        # File: models.py:111 in forward, code: causal = torch.ones(s, s, dtype=torch.bool).tril()
        ones: "b8[4, 4]" = torch.ops.aten.ones.default([4, 4], dtype = torch.bool, device = device(type='cpu'), pin_memory = False)
        tril: "b8[4, 4]" = torch.ops.aten.tril.default(ones);  ones = None

        # File: models.py:112 in forward, code: scores = scores.masked_fill(~causal, float("-inf"))
        bitwise_not: "b8[4, 4]" = torch.ops.aten.bitwise_not.default(tril);  tril = None
        masked_fill: "f32[2, 4, 4, 4]" = torch.ops.aten.masked_fill.Scalar(div, bitwise_not, -inf);  div = bitwise_not = None

        # File: models.py:113 in forward, code: out = torch.softmax(scores, dim=-1) @ v
        _softmax: "f32[2, 4, 4, 4]" = torch.ops.aten._softmax.default(masked_fill, -1, False);  masked_fill = None
        expand_2: "f32[2, 4, 4, 4]" = torch.ops.aten.expand.default(_softmax, [2, 4, 4, 4]);  _softmax = None
        view_6: "f32[8, 4, 4]" = torch.ops.aten.view.default(expand_2, [8, 4, 4]);  expand_2 = None
        expand_3: "f32[2, 4, 4, 2]" = torch.ops.aten.expand.default(transpose_2, [2, 4, 4, 2]);  transpose_2 = None
        clone_2: "f32[2, 4, 4, 2]" = torch.ops.aten.clone.default(expand_3, memory_format = torch.contiguous_format);  expand_3 = None
        _unsafe_view_6: "f32[8, 4, 2]" = torch.ops.aten._unsafe_view.default(clone_2, [8, 4, 2]);  clone_2 = None
        bmm_1: "f32[8, 4, 2]" = torch.ops.aten.bmm.default(view_6, _unsafe_view_6);  view_6 = _unsafe_view_6 = None
        _unsafe_view_7: "f32[2, 4, 4, 2]" = torch.ops.aten._unsafe_view.default(bmm_1, [2, 4, 4, 2]);  bmm_1 = None

        # File: models.py:114 in forward, code: return self.wo(out.transpose(1, 2).reshape(b, s, -1))
        transpose_4: "f32[2, 4, 4, 2]" = torch.ops.aten.transpose.int(_unsafe_view_7, 1, 2);  _unsafe_view_7 = None
        clone_3: "f32[2, 4, 4, 2]" = torch.ops.aten.clone.default(transpose_4, memory_format = torch.contiguous_format);  transpose_4 = None
        _unsafe_view_8: "f32[2, 4, 8]" = torch.ops.aten._unsafe_view.default(clone_3, [2, 4, 8]);  clone_3 = None
        t_3: "f32[8, 8]" = torch.ops.aten.t.default(attention_wo_weight);  attention_wo_weight = None
        view_7: "f32[8, 8]" = torch.ops.aten.view.default(_unsafe_view_8, [8, 8]);  _unsafe_view_8 = None
        mm_3: "f32[8, 8]" = torch.ops.aten.mm.default(view_7, t_3);  view_7 = t_3 = None
        _unsafe_view_9: "f32[2, 4, 8]" = torch.ops.aten._unsafe_view.default(mm_3, [2, 4, 8]);  mm_3 = None

        # File: models.py:143 in forward, code: x = x + self.attention(self.attention_norm(x))
        add_1: "f32[2, 4, 8]" = torch.ops.aten.add.Tensor(x, _unsafe_view_9);  x = _unsafe_view_9 = None

        # File: models.py:90 in forward, code: return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        pow_2: "f32[2, 4, 8]" = torch.ops.aten.pow.Tensor_Scalar(add_1, 2)
        mean_1: "f32[2, 4, 1]" = torch.ops.aten.mean.dim(pow_2, [-1], True);  pow_2 = None
        add_2: "f32[2, 4, 1]" = torch.ops.aten.add.Tensor(mean_1, 1e-06);  mean_1 = None
        rsqrt_1: "f32[2, 4, 1]" = torch.ops.aten.rsqrt.default(add_2);  add_2 = None
        mul_2: "f32[2, 4, 8]" = torch.ops.aten.mul.Tensor(add_1, rsqrt_1);  rsqrt_1 = None
        mul_3: "f32[2, 4, 8]" = torch.ops.aten.mul.Tensor(mul_2, ffn_norm_weight);  mul_2 = ffn_norm_weight = None

        # File: models.py:127 in forward, code: return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))
        t_4: "f32[8, 16]" = torch.ops.aten.t.default(feed_forward_w1_weight);  feed_forward_w1_weight = None
        view_8: "f32[8, 8]" = torch.ops.aten.view.default(mul_3, [8, 8])
        mm_4: "f32[8, 16]" = torch.ops.aten.mm.default(view_8, t_4);  view_8 = t_4 = None
        _unsafe_view_10: "f32[2, 4, 16]" = torch.ops.aten._unsafe_view.default(mm_4, [2, 4, 16]);  mm_4 = None
        silu: "f32[2, 4, 16]" = torch.ops.aten.silu.default(_unsafe_view_10);  _unsafe_view_10 = None
        t_5: "f32[8, 16]" = torch.ops.aten.t.default(feed_forward_w3_weight);  feed_forward_w3_weight = None
        view_9: "f32[8, 8]" = torch.ops.aten.view.default(mul_3, [8, 8]);  mul_3 = None
        mm_5: "f32[8, 16]" = torch.ops.aten.mm.default(view_9, t_5);  view_9 = t_5 = None
        _unsafe_view_11: "f32[2, 4, 16]" = torch.ops.aten._unsafe_view.default(mm_5, [2, 4, 16]);  mm_5 = None
        mul_4: "f32[2, 4, 16]" = torch.ops.aten.mul.Tensor(silu, _unsafe_view_11);  silu = _unsafe_view_11 = None
        t_6: "f32[16, 8]" = torch.ops.aten.t.default(feed_forward_w2_weight);  feed_forward_w2_weight = None
        view_10: "f32[8, 16]" = torch.ops.aten.view.default(mul_4, [8, 16]);  mul_4 = None
        mm_6: "f32[8, 8]" = torch.ops.aten.mm.default(view_10, t_6);  view_10 = t_6 = None
        _unsafe_view_12: "f32[2, 4, 8]" = torch.ops.aten._unsafe_view.default(mm_6, [2, 4, 8]);  mm_6 = None

        # File: models.py:144 in forward, code: x = x + self.feed_forward(self.ffn_norm(x))
        add_3: "f32[2, 4, 8]" = torch.ops.aten.add.Tensor(add_1, _unsafe_view_12);  add_1 = _unsafe_view_12 = None

        # File: models.py:90 in forward, code: return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        pow_3: "f32[2, 4, 8]" = torch.ops.aten.pow.Tensor_Scalar(add_3, 2)
        mean_2: "f32[2, 4, 1]" = torch.ops.aten.mean.dim(pow_3, [-1], True);  pow_3 = None
        add_4: "f32[2, 4, 1]" = torch.ops.aten.add.Tensor(mean_2, 1e-06);  mean_2 = None
        rsqrt_2: "f32[2, 4, 1]" = torch.ops.aten.rsqrt.default(add_4);  add_4 = None
        mul_5: "f32[2, 4, 8]" = torch.ops.aten.mul.Tensor(add_3, rsqrt_2);  add_3 = rsqrt_2 = None
        mul_6: "f32[2, 4, 8]" = torch.ops.aten.mul.Tensor(mul_5, norm_weight);  mul_5 = norm_weight = None

        # File: models.py:145 in forward, code: return self.output(self.norm(x))
        t_7: "f32[8, 8]" = torch.ops.aten.t.default(output_weight);  output_weight = None
        view_11: "f32[8, 8]" = torch.ops.aten.view.default(mul_6, [8, 8]);  mul_6 = None
        mm_7: "f32[8, 8]" = torch.ops.aten.mm.default(view_11, t_7);  view_11 = t_7 = None
        out: "f32[2, 4, 8]" = torch.ops.aten._unsafe_view.default(mm_7, [2, 4, 8]);  mm_7 = None
        return (out,)
